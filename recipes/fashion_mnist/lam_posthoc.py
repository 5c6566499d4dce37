"""Recipe: post-hoc LAM: contrastive training, then a last-layer Laplace (LAM section 3), on fashion_mnist.

Run: ``python recipes/fashion_mnist/lam_posthoc.py --epochs 10 --out runs/fashion_mnist/lam_posthoc``
(``--help`` lists the options; hyper-parameters: :mod:`bayesurl.recipes`).
"""

from bayesurl.recipes import run_recipe_cli

if __name__ == "__main__":
    raise SystemExit(run_recipe_cli("lam_posthoc", "fashion_mnist"))
