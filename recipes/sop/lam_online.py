"""Recipe: lam_online on Stanford Online Products.

Online LAM: Laplace updated while training (LAM eqs. 4-5).
Hyper-parameters: :mod:`bayesurl.recipes`; ``--help`` lists the options.
Run::

    python recipes/sop/lam_online.py --root DATA_ROOT --pretrained --device cuda
"""

from bayesurl.recipes import run_recipe_cli

if __name__ == "__main__":
    raise SystemExit(run_recipe_cli("lam_online", "sop"))
