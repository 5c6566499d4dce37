"""Recipe: sngp on FashionMNIST.

SNGP: spectral-normalised Gaussian-process head (URL appendix B).
Hyper-parameters: :mod:`bayesurl.recipes`; ``--help`` lists the options.
Run::

    python recipes/fashion_mnist/sngp.py --out runs/fashion_mnist/sngp
"""

from bayesurl.recipes import run_recipe_cli

if __name__ == "__main__":
    raise SystemExit(run_recipe_cli("sngp", "fashion_mnist"))
