"""Recipe: tau on FashionMNIST.

TaU: joint Temperature-as-Uncertainty SimCLR training (TaU Algorithm 1).
Hyper-parameters: :mod:`bayesurl.recipes`; ``--help`` lists the options.
Run::

    python recipes/fashion_mnist/tau.py --out runs/fashion_mnist/tau
"""

from bayesurl.recipes import run_recipe_cli

if __name__ == "__main__":
    raise SystemExit(run_recipe_cli("tau", "fashion_mnist"))
