"""Recipe: ce on ImageNet upstream (URL setup).

CE: cross-entropy classifier, u = softmax entropy (URL appendix B).
Hyper-parameters: :mod:`bayesurl.recipes`; ``--help`` lists the options.
Run::

    torchrun --nproc_per_node 8 recipes/imagenet/ce.py \
        --root IMAGENET --downstream-root DML_ROOT --pretrained
"""

from bayesurl.recipes import run_recipe_cli

if __name__ == "__main__":
    raise SystemExit(run_recipe_cli("ce", "imagenet"))
