"""Recipe: ensemble on CARS196.

Ensemble: 10 classifier heads on one embedding (URL appendix B).
Hyper-parameters: :mod:`bayesurl.recipes`; ``--help`` lists the options.
Run::

    python recipes/cars/ensemble.py --root DATA_ROOT --pretrained --device cuda
"""

from bayesurl.recipes import run_recipe_cli

if __name__ == "__main__":
    raise SystemExit(run_recipe_cli("ensemble", "cars"))
