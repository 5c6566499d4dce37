"""Recipe: hib on FashionMNIST.

HIB: hedged instance embeddings (URL appendix B).
Hyper-parameters: :mod:`bayesurl.recipes`; ``--help`` lists the options.
Run::

    python recipes/fashion_mnist/hib.py --out runs/fashion_mnist/hib
"""

from bayesurl.recipes import run_recipe_cli

if __name__ == "__main__":
    raise SystemExit(run_recipe_cli("hib", "fashion_mnist"))
