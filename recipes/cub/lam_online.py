"""Recipe: online LAM: Laplace updated during contrastive training (LAM eqs. 4-5), on cub.

Run: ``python recipes/cub/lam_online.py --root DATA_ROOT --pretrained --device cuda``
(``--help`` lists the options; hyper-parameters: :mod:`bayesurl.recipes`).
"""

from bayesurl.recipes import run_recipe_cli

if __name__ == "__main__":
    raise SystemExit(run_recipe_cli("lam_online", "cub"))
