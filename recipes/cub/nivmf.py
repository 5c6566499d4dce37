"""Recipe: nivMF: non-isotropic vMF class proxies (URL appendix B), on cub.

Run: ``python recipes/cub/nivmf.py --root DATA_ROOT --pretrained --device cuda``
(``--help`` lists the options; hyper-parameters: :mod:`bayesurl.recipes`).
"""

from bayesurl.recipes import run_recipe_cli

if __name__ == "__main__":
    raise SystemExit(run_recipe_cli("nivmf", "cub"))
