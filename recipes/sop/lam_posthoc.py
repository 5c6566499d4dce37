"""Recipe: post-hoc LAM: contrastive training, then a last-layer Laplace (LAM section 3), on sop.

Run: ``python recipes/sop/lam_posthoc.py --root DATA_ROOT --pretrained --device cuda``
(``--help`` lists the options; hyper-parameters: :mod:`bayesurl.recipes`).
"""

from bayesurl.recipes import run_recipe_cli

if __name__ == "__main__":
    raise SystemExit(run_recipe_cli("lam_posthoc", "sop"))
