"""Recipe: MCInfoNCE: probabilistic contrastive learning with vMF posteriors (URL appendix B; Kirchhof et al., 2023), on fashion_mnist.

Run: ``python recipes/fashion_mnist/mcinfonce.py --epochs 10 --out runs/fashion_mnist/mcinfonce``
(``--help`` lists the options; hyper-parameters: :mod:`bayesurl.recipes`).
"""

from bayesurl.recipes import run_recipe_cli

if __name__ == "__main__":
    raise SystemExit(run_recipe_cli("mcinfonce", "fashion_mnist"))
