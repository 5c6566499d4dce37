"""Recipe: losspred on ImageNet upstream (URL setup).

Losspred: CE plus a loss-prediction head (URL appendix B, eq. 8).
Hyper-parameters: :mod:`bayesurl.recipes`; ``--help`` lists the options.
Run::

    torchrun --nproc_per_node 8 recipes/imagenet/losspred.py \
        --root IMAGENET --downstream-root DML_ROOT --pretrained
"""

from bayesurl.recipes import run_recipe_cli

if __name__ == "__main__":
    raise SystemExit(run_recipe_cli("losspred", "imagenet"))
