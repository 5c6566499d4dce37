"""Recipe: Ensemble: 10 classifier heads on one embedding (URL appendix B), on fashion_mnist.

Run: ``python recipes/fashion_mnist/ensemble.py --epochs 10 --out runs/fashion_mnist/ensemble``
(``--help`` lists the options; hyper-parameters: :mod:`bayesurl.recipes`).
"""

from bayesurl.recipes import run_recipe_cli

if __name__ == "__main__":
    raise SystemExit(run_recipe_cli("ensemble", "fashion_mnist"))
