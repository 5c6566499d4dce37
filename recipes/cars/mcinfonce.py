"""Recipe: MCInfoNCE: probabilistic contrastive learning with vMF posteriors (URL appendix B; Kirchhof et al., 2023), on cars.

Run: ``python recipes/cars/mcinfonce.py --root DATA_ROOT --pretrained --device cuda``
(``--help`` lists the options; hyper-parameters: :mod:`bayesurl.recipes`).
"""

from bayesurl.recipes import run_recipe_cli

if __name__ == "__main__":
    raise SystemExit(run_recipe_cli("mcinfonce", "cars"))
