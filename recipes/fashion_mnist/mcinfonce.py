"""Recipe: mcinfonce on FashionMNIST.

MCInfoNCE: contrastive learning with vMF posteriors (URL appendix B).
Hyper-parameters: :mod:`bayesurl.recipes`; ``--help`` lists the options.
Run::

    python recipes/fashion_mnist/mcinfonce.py --out runs/fashion_mnist/mcinfonce
"""

from bayesurl.recipes import run_recipe_cli

if __name__ == "__main__":
    raise SystemExit(run_recipe_cli("mcinfonce", "fashion_mnist"))
