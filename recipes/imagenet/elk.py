"""Recipe: elk on ImageNet upstream (URL setup).

ELK: expected likelihood kernel to vMF class proxies (URL appendix B).
Hyper-parameters: :mod:`bayesurl.recipes`; ``--help`` lists the options.
Run::

    torchrun --nproc_per_node 8 recipes/imagenet/elk.py \
        --root IMAGENET --downstream-root DML_ROOT --pretrained
"""

from bayesurl.recipes import run_recipe_cli

if __name__ == "__main__":
    raise SystemExit(run_recipe_cli("elk", "imagenet"))
