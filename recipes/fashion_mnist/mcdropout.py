"""Recipe: mcdropout on FashionMNIST.

MC dropout in the embedding head (URL appendix B).
Hyper-parameters: :mod:`bayesurl.recipes`; ``--help`` lists the options.
Run::

    python recipes/fashion_mnist/mcdropout.py --out runs/fashion_mnist/mcdropout
"""

from bayesurl.recipes import run_recipe_cli

if __name__ == "__main__":
    raise SystemExit(run_recipe_cli("mcdropout", "fashion_mnist"))
