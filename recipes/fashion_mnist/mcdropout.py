"""Recipe: MC dropout in the embedding head (URL appendix B), on fashion_mnist.

Run: ``python recipes/fashion_mnist/mcdropout.py --epochs 10 --out runs/fashion_mnist/mcdropout``
(``--help`` lists the options; hyper-parameters: :mod:`bayesurl.recipes`).
"""

from bayesurl.recipes import run_recipe_cli

if __name__ == "__main__":
    raise SystemExit(run_recipe_cli("mcdropout", "fashion_mnist"))
