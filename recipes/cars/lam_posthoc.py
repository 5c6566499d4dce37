"""Recipe: lam_posthoc on CARS196.

Post-hoc LAM: contrastive training, then last-layer Laplace (LAM sec. 3).
Hyper-parameters: :mod:`bayesurl.recipes`; ``--help`` lists the options.
Run::

    python recipes/cars/lam_posthoc.py --root DATA_ROOT --pretrained --device cuda
"""

from bayesurl.recipes import run_recipe_cli

if __name__ == "__main__":
    raise SystemExit(run_recipe_cli("lam_posthoc", "cars"))
