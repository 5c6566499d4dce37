"""Recipe: infonce on FashionMNIST.

InfoNCE (SimCLR, two views), u from the embedding norm (URL appendix B).
Hyper-parameters: :mod:`bayesurl.recipes`; ``--help`` lists the options.
Run::

    python recipes/fashion_mnist/infonce.py --out runs/fashion_mnist/infonce
"""

from bayesurl.recipes import run_recipe_cli

if __name__ == "__main__":
    raise SystemExit(run_recipe_cli("infonce", "fashion_mnist"))
