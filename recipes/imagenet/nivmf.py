"""Recipe: nivmf on ImageNet upstream (URL setup).

nivMF: non-isotropic vMF class proxies (URL appendix B).
Hyper-parameters: :mod:`bayesurl.recipes`; ``--help`` lists the options.
Run::

    torchrun --nproc_per_node 8 recipes/imagenet/nivmf.py \
        --root IMAGENET --downstream-root DML_ROOT --pretrained
"""

from bayesurl.recipes import run_recipe_cli

if __name__ == "__main__":
    raise SystemExit(run_recipe_cli("nivmf", "imagenet"))
