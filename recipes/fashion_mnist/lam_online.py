"""Recipe: lam_online on FashionMNIST.

Online LAM: Laplace updated while training (LAM eqs. 4-5).
Hyper-parameters: :mod:`bayesurl.recipes`; ``--help`` lists the options.
Run::

    python recipes/fashion_mnist/lam_online.py --out runs/fashion_mnist/lam_online
"""

from bayesurl.recipes import run_recipe_cli

if __name__ == "__main__":
    raise SystemExit(run_recipe_cli("lam_online", "fashion_mnist"))
