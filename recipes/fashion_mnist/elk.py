"""Recipe: elk on FashionMNIST.

ELK: expected likelihood kernel to vMF class proxies (URL appendix B).
Hyper-parameters: :mod:`bayesurl.recipes`; ``--help`` lists the options.
Run::

    python recipes/fashion_mnist/elk.py --out runs/fashion_mnist/elk
"""

from bayesurl.recipes import run_recipe_cli

if __name__ == "__main__":
    raise SystemExit(run_recipe_cli("elk", "fashion_mnist"))
