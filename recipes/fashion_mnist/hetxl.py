"""Recipe: hetxl on FashionMNIST.

HET-XL: heteroscedastic classifier (URL appendix B).
Hyper-parameters: :mod:`bayesurl.recipes`; ``--help`` lists the options.
Run::

    python recipes/fashion_mnist/hetxl.py --out runs/fashion_mnist/hetxl
"""

from bayesurl.recipes import run_recipe_cli

if __name__ == "__main__":
    raise SystemExit(run_recipe_cli("hetxl", "fashion_mnist"))
