"""Recipe: tau on CARS196.

TaU: joint Temperature-as-Uncertainty SimCLR training (TaU Algorithm 1).
Hyper-parameters: :mod:`bayesurl.recipes`; ``--help`` lists the options.
Run::

    python recipes/cars/tau.py --root DATA_ROOT --pretrained --device cuda
"""

from bayesurl.recipes import run_recipe_cli

if __name__ == "__main__":
    raise SystemExit(run_recipe_cli("tau", "cars"))
