"""Recipe: CE: cross-entropy classifier, u = softmax entropy (URL appendix B), on fashion_mnist.

Run: ``python recipes/fashion_mnist/ce.py --epochs 10 --out runs/fashion_mnist/ce``
(``--help`` lists the options; hyper-parameters: :mod:`bayesurl.recipes`).
"""

from bayesurl.recipes import run_recipe_cli

if __name__ == "__main__":
    raise SystemExit(run_recipe_cli("ce", "fashion_mnist"))
