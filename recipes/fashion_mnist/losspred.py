"""Recipe: Losspred: CE plus a loss-prediction head (URL appendix B, eq. 8), on fashion_mnist.

Run: ``python recipes/fashion_mnist/losspred.py --epochs 10 --out runs/fashion_mnist/losspred``
(``--help`` lists the options; hyper-parameters: :mod:`bayesurl.recipes`).
"""

from bayesurl.recipes import run_recipe_cli

if __name__ == "__main__":
    raise SystemExit(run_recipe_cli("losspred", "fashion_mnist"))
