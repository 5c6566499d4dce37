"""Recipe: Ensemble: 10 classifier heads on one embedding (URL appendix B), on sop.

Run: ``python recipes/sop/ensemble.py --root DATA_ROOT --pretrained --device cuda``
(``--help`` lists the options; hyper-parameters: :mod:`bayesurl.recipes`).
"""

from bayesurl.recipes import run_recipe_cli

if __name__ == "__main__":
    raise SystemExit(run_recipe_cli("ensemble", "sop"))
