"""Recipe: PVU: a CE encoder plus a post-hoc loss-prediction head (thesis section 5.3), on cars.

Run: ``python recipes/cars/pvu.py --root DATA_ROOT --pretrained --device cuda``
(``--help`` lists the options; hyper-parameters: :mod:`bayesurl.recipes`).
"""

from bayesurl.recipes import run_recipe_cli

if __name__ == "__main__":
    raise SystemExit(run_recipe_cli("pvu", "cars"))
