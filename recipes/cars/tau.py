"""Recipe: TaU: joint Temperature-as-Uncertainty SimCLR training (TaU Algorithm 1), on cars.

Run: ``python recipes/cars/tau.py --root DATA_ROOT --pretrained --device cuda``
(``--help`` lists the options; hyper-parameters: :mod:`bayesurl.recipes`).
"""

from bayesurl.recipes import run_recipe_cli

if __name__ == "__main__":
    raise SystemExit(run_recipe_cli("tau", "cars"))
