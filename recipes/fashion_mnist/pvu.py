"""Recipe: pvu on FashionMNIST.

PVU: a CE encoder plus a post-hoc loss-prediction head (thesis 5.3).
Hyper-parameters: :mod:`bayesurl.recipes`; ``--help`` lists the options.
Run::

    python recipes/fashion_mnist/pvu.py --out runs/fashion_mnist/pvu
"""

from bayesurl.recipes import run_recipe_cli

if __name__ == "__main__":
    raise SystemExit(run_recipe_cli("pvu", "fashion_mnist"))
