"""Recipe: tau on CUB-200-2011.

TaU: joint Temperature-as-Uncertainty SimCLR training (TaU Algorithm 1).
Hyper-parameters: :mod:`bayesurl.recipes`; ``--help`` lists the options.
Run::

    python recipes/cub/tau.py --root DATA_ROOT --pretrained --device cuda
"""

from bayesurl.recipes import run_recipe_cli

if __name__ == "__main__":
    raise SystemExit(run_recipe_cli("tau", "cub"))
