"""Recipe: losspred on FashionMNIST.

Losspred: CE plus a loss-prediction head (URL appendix B, eq. 8).
Hyper-parameters: :mod:`bayesurl.recipes`; ``--help`` lists the options.
Run::

    python recipes/fashion_mnist/losspred.py --out runs/fashion_mnist/losspred
"""

from bayesurl.recipes import run_recipe_cli

if __name__ == "__main__":
    raise SystemExit(run_recipe_cli("losspred", "fashion_mnist"))
