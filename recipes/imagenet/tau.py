"""Recipe: tau on ImageNet upstream (URL setup).

TaU: joint Temperature-as-Uncertainty SimCLR training (TaU Algorithm 1).
Hyper-parameters: :mod:`bayesurl.recipes`; ``--help`` lists the options.
Run::

    torchrun --nproc_per_node 8 recipes/imagenet/tau.py \
        --root IMAGENET --downstream-root DML_ROOT --pretrained
"""

from bayesurl.recipes import run_recipe_cli

if __name__ == "__main__":
    raise SystemExit(run_recipe_cli("tau", "imagenet"))
