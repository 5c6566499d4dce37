"""Recipe: HET-XL: heteroscedastic classifier in embedding space (URL appendix B), on cub.

Run: ``python recipes/cub/hetxl.py --root DATA_ROOT --pretrained --device cuda``
(``--help`` lists the options; hyper-parameters: :mod:`bayesurl.recipes`).
"""

from bayesurl.recipes import run_recipe_cli

if __name__ == "__main__":
    raise SystemExit(run_recipe_cli("hetxl", "cub"))
