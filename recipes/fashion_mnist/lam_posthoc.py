"""Recipe: lam_posthoc on FashionMNIST.

Post-hoc LAM: contrastive training, then last-layer Laplace (LAM sec. 3).
Hyper-parameters: :mod:`bayesurl.recipes`; ``--help`` lists the options.
Run::

    python recipes/fashion_mnist/lam_posthoc.py --out runs/fashion_mnist/lam_posthoc
"""

from bayesurl.recipes import run_recipe_cli

if __name__ == "__main__":
    raise SystemExit(run_recipe_cli("lam_posthoc", "fashion_mnist"))
