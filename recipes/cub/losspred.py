"""Recipe: losspred on CUB-200-2011.

Losspred: CE plus a loss-prediction head (URL appendix B, eq. 8).
Hyper-parameters: :mod:`bayesurl.recipes`; ``--help`` lists the options.
Run::

    python recipes/cub/losspred.py --root DATA_ROOT --pretrained --device cuda
"""

from bayesurl.recipes import run_recipe_cli

if __name__ == "__main__":
    raise SystemExit(run_recipe_cli("losspred", "cub"))
