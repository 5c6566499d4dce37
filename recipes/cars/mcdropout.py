"""Recipe: mcdropout on CARS196.

MC dropout in the embedding head (URL appendix B).
Hyper-parameters: :mod:`bayesurl.recipes`; ``--help`` lists the options.
Run::

    python recipes/cars/mcdropout.py --root DATA_ROOT --pretrained --device cuda
"""

from bayesurl.recipes import run_recipe_cli

if __name__ == "__main__":
    raise SystemExit(run_recipe_cli("mcdropout", "cars"))
