"""Recipe: ELK: expected likelihood kernel to vMF class proxies (URL appendix B), on fashion_mnist.

Run: ``python recipes/fashion_mnist/elk.py --epochs 10 --out runs/fashion_mnist/elk``
(``--help`` lists the options; hyper-parameters: :mod:`bayesurl.recipes`).
"""

from bayesurl.recipes import run_recipe_cli

if __name__ == "__main__":
    raise SystemExit(run_recipe_cli("elk", "fashion_mnist"))
