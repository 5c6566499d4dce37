"""Recipe: MCInfoNCE: probabilistic contrastive learning with vMF posteriors (URL appendix B; Kirchhof et al., 2023), on imagenet.

Run: ``torchrun --nproc_per_node 8 recipes/imagenet/mcinfonce.py --root IMAGENET --downstream-root DML_ROOT --pretrained``
(``--help`` lists the options; hyper-parameters: :mod:`bayesurl.recipes`).
"""

from bayesurl.recipes import run_recipe_cli

if __name__ == "__main__":
    raise SystemExit(run_recipe_cli("mcinfonce", "imagenet"))
