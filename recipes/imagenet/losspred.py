"""Recipe: Losspred: CE plus a loss-prediction head (URL appendix B, eq. 8), on imagenet.

Run: ``torchrun --nproc_per_node 8 recipes/imagenet/losspred.py --root IMAGENET --downstream-root DML_ROOT --pretrained``
(``--help`` lists the options; hyper-parameters: :mod:`bayesurl.recipes`).
"""

from bayesurl.recipes import run_recipe_cli

if __name__ == "__main__":
    raise SystemExit(run_recipe_cli("losspred", "imagenet"))
