"""Recipe: post-hoc LAM: contrastive training, then a last-layer Laplace (LAM section 3), on imagenet.

Run: ``torchrun --nproc_per_node 8 recipes/imagenet/lam_posthoc.py --root IMAGENET --downstream-root DML_ROOT --pretrained``
(``--help`` lists the options; hyper-parameters: :mod:`bayesurl.recipes`).
"""

from bayesurl.recipes import run_recipe_cli

if __name__ == "__main__":
    raise SystemExit(run_recipe_cli("lam_posthoc", "imagenet"))
