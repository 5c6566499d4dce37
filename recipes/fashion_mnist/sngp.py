"""Recipe: SNGP: spectral-normalised Gaussian-process head (URL appendix B), on fashion_mnist.

Run: ``python recipes/fashion_mnist/sngp.py --epochs 10 --out runs/fashion_mnist/sngp``
(``--help`` lists the options; hyper-parameters: :mod:`bayesurl.recipes`).
"""

from bayesurl.recipes import run_recipe_cli

if __name__ == "__main__":
    raise SystemExit(run_recipe_cli("sngp", "fashion_mnist"))
