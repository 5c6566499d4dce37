"""Recipe: lam_posthoc on ImageNet upstream (URL setup).

Post-hoc LAM: contrastive training, then last-layer Laplace (LAM sec. 3).
Hyper-parameters: :mod:`bayesurl.recipes`; ``--help`` lists the options.
Run::

    torchrun --nproc_per_node 8 recipes/imagenet/lam_posthoc.py \
        --root IMAGENET --downstream-root DML_ROOT --pretrained
"""

from bayesurl.recipes import run_recipe_cli

if __name__ == "__main__":
    raise SystemExit(run_recipe_cli("lam_posthoc", "imagenet"))
