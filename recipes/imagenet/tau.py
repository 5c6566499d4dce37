"""Recipe: TaU: joint Temperature-as-Uncertainty SimCLR training (TaU Algorithm 1), on imagenet.

Run: ``torchrun --nproc_per_node 8 recipes/imagenet/tau.py --root IMAGENET --downstream-root DML_ROOT --pretrained``
(``--help`` lists the options; hyper-parameters: :mod:`bayesurl.recipes`).
"""

from bayesurl.recipes import run_recipe_cli

if __name__ == "__main__":
    raise SystemExit(run_recipe_cli("tau", "imagenet"))
