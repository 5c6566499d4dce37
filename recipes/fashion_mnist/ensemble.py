"""Recipe: ensemble on FashionMNIST.

Ensemble: 10 classifier heads on one embedding (URL appendix B).
Hyper-parameters: :mod:`bayesurl.recipes`; ``--help`` lists the options.
Run::

    python recipes/fashion_mnist/ensemble.py --out runs/fashion_mnist/ensemble
"""

from bayesurl.recipes import run_recipe_cli

if __name__ == "__main__":
    raise SystemExit(run_recipe_cli("ensemble", "fashion_mnist"))
