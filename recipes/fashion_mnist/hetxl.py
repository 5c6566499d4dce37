"""Recipe: HET-XL: heteroscedastic classifier in embedding space (URL appendix B), on fashion_mnist.

Run: ``python recipes/fashion_mnist/hetxl.py --epochs 10 --out runs/fashion_mnist/hetxl``
(``--help`` lists the options; hyper-parameters: :mod:`bayesurl.recipes`).
"""

from bayesurl.recipes import run_recipe_cli

if __name__ == "__main__":
    raise SystemExit(run_recipe_cli("hetxl", "fashion_mnist"))
