"""Recipe: InfoNCE (SimCLR, two views), u = 1/||e|| (URL appendix B), on fashion_mnist.

Run: ``python recipes/fashion_mnist/infonce.py --epochs 10 --out runs/fashion_mnist/infonce``
(``--help`` lists the options; hyper-parameters: :mod:`bayesurl.recipes`).
"""

from bayesurl.recipes import run_recipe_cli

if __name__ == "__main__":
    raise SystemExit(run_recipe_cli("infonce", "fashion_mnist"))
