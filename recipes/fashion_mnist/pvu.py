"""Recipe: PVU: a CE encoder plus a post-hoc loss-prediction head (thesis section 5.3), on fashion_mnist.

Run: ``python recipes/fashion_mnist/pvu.py --epochs 10 --out runs/fashion_mnist/pvu``
(``--help`` lists the options; hyper-parameters: :mod:`bayesurl.recipes`).
"""

from bayesurl.recipes import run_recipe_cli

if __name__ == "__main__":
    raise SystemExit(run_recipe_cli("pvu", "fashion_mnist"))
