"""Recipe: nivmf on FashionMNIST.

nivMF: non-isotropic vMF class proxies (URL appendix B).
Hyper-parameters: :mod:`bayesurl.recipes`; ``--help`` lists the options.
Run::

    python recipes/fashion_mnist/nivmf.py --out runs/fashion_mnist/nivmf
"""

from bayesurl.recipes import run_recipe_cli

if __name__ == "__main__":
    raise SystemExit(run_recipe_cli("nivmf", "fashion_mnist"))
