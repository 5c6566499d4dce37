"""Recipe: ce on FashionMNIST.

CE: cross-entropy classifier, u = softmax entropy (URL appendix B).
Hyper-parameters: :mod:`bayesurl.recipes`; ``--help`` lists the options.
Run::

    python recipes/fashion_mnist/ce.py --out runs/fashion_mnist/ce
"""

from bayesurl.recipes import run_recipe_cli

if __name__ == "__main__":
    raise SystemExit(run_recipe_cli("ce", "fashion_mnist"))
