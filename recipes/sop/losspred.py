"""Recipe: losspred on Stanford Online Products.

Losspred: CE plus a loss-prediction head (URL appendix B, eq. 8).
Hyper-parameters: :mod:`bayesurl.recipes`; ``--help`` lists the options.
Run::

    python recipes/sop/losspred.py --root DATA_ROOT --pretrained --device cuda
"""

from bayesurl.recipes import run_recipe_cli

if __name__ == "__main__":
    raise SystemExit(run_recipe_cli("losspred", "sop"))
