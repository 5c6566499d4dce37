"""Recipe: TaU: joint Temperature-as-Uncertainty SimCLR training (TaU Algorithm 1), on fashion_mnist.

Run: ``python recipes/fashion_mnist/tau.py --epochs 10 --out runs/fashion_mnist/tau``
(``--help`` lists the options; hyper-parameters: :mod:`bayesurl.recipes`).
"""

from bayesurl.recipes import run_recipe_cli

if __name__ == "__main__":
    raise SystemExit(run_recipe_cli("tau", "fashion_mnist"))
