"""Recipe: MC dropout in the embedding head (URL appendix B), on imagenet.

Run: ``torchrun --nproc_per_node 8 recipes/imagenet/mcdropout.py --root IMAGENET --downstream-root DML_ROOT --pretrained``
(``--help`` lists the options; hyper-parameters: :mod:`bayesurl.recipes`).
"""

from bayesurl.recipes import run_recipe_cli

if __name__ == "__main__":
    raise SystemExit(run_recipe_cli("mcdropout", "imagenet"))
