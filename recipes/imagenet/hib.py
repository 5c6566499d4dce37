"""Recipe: HIB: hedged instance embeddings (URL appendix B), on imagenet.

Run: ``torchrun --nproc_per_node 8 recipes/imagenet/hib.py --root IMAGENET --downstream-root DML_ROOT --pretrained``
(``--help`` lists the options; hyper-parameters: :mod:`bayesurl.recipes`).
"""

from bayesurl.recipes import run_recipe_cli

if __name__ == "__main__":
    raise SystemExit(run_recipe_cli("hib", "imagenet"))
