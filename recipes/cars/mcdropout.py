"""Recipe: MC dropout in the embedding head (URL appendix B), on cars.

Run: ``python recipes/cars/mcdropout.py --root DATA_ROOT --pretrained --device cuda``
(``--help`` lists the options; hyper-parameters: :mod:`bayesurl.recipes`).
"""

from bayesurl.recipes import run_recipe_cli

if __name__ == "__main__":
    raise SystemExit(run_recipe_cli("mcdropout", "cars"))
