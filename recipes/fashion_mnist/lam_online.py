"""Recipe: online LAM: Laplace updated during contrastive training (LAM eqs. 4-5), on fashion_mnist.

Run: ``python recipes/fashion_mnist/lam_online.py --epochs 10 --out runs/fashion_mnist/lam_online``
(``--help`` lists the options; hyper-parameters: :mod:`bayesurl.recipes`).
"""

from bayesurl.recipes import run_recipe_cli

if __name__ == "__main__":
    raise SystemExit(run_recipe_cli("lam_online", "fashion_mnist"))
