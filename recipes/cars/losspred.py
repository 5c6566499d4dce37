"""Recipe: Losspred: CE plus a loss-prediction head (URL appendix B, eq. 8), on cars.

Run: ``python recipes/cars/losspred.py --root DATA_ROOT --pretrained --device cuda``
(``--help`` lists the options; hyper-parameters: :mod:`bayesurl.recipes`).
"""

from bayesurl.recipes import run_recipe_cli

if __name__ == "__main__":
    raise SystemExit(run_recipe_cli("losspred", "cars"))
