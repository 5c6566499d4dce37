"""Recipe: sngp on CUB-200-2011.

SNGP: spectral-normalised Gaussian-process head (URL appendix B).
Hyper-parameters: :mod:`bayesurl.recipes`; ``--help`` lists the options.
Run::

    python recipes/cub/sngp.py --root DATA_ROOT --pretrained --device cuda
"""

from bayesurl.recipes import run_recipe_cli

if __name__ == "__main__":
    raise SystemExit(run_recipe_cli("sngp", "cub"))
