"""Recipe: pvu on ImageNet upstream (URL setup).

PVU: a CE encoder plus a post-hoc loss-prediction head (thesis 5.3).
Hyper-parameters: :mod:`bayesurl.recipes`; ``--help`` lists the options.
Run::

    torchrun --nproc_per_node 8 recipes/imagenet/pvu.py \
        --root IMAGENET --downstream-root DML_ROOT --pretrained
"""

from bayesurl.recipes import run_recipe_cli

if __name__ == "__main__":
    raise SystemExit(run_recipe_cli("pvu", "imagenet"))
