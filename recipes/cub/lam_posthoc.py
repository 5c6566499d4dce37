"""Recipe: lam_posthoc on CUB-200-2011.

Post-hoc LAM: contrastive training, then last-layer Laplace (LAM sec. 3).
Hyper-parameters: :mod:`bayesurl.recipes`; ``--help`` lists the options.
Run::

    python recipes/cub/lam_posthoc.py --root DATA_ROOT --pretrained --device cuda
"""

from bayesurl.recipes import run_recipe_cli

if __name__ == "__main__":
    raise SystemExit(run_recipe_cli("lam_posthoc", "cub"))
