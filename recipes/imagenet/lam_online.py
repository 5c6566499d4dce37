"""Recipe: lam_online on ImageNet upstream (URL setup).

Online LAM: Laplace updated while training (LAM eqs. 4-5).
Hyper-parameters: :mod:`bayesurl.recipes`; ``--help`` lists the options.
Run::

    torchrun --nproc_per_node 8 recipes/imagenet/lam_online.py \
        --root IMAGENET --downstream-root DML_ROOT --pretrained
"""

from bayesurl.recipes import run_recipe_cli

if __name__ == "__main__":
    raise SystemExit(run_recipe_cli("lam_online", "imagenet"))
