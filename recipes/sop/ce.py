"""Recipe: ce on Stanford Online Products.

CE: cross-entropy classifier, u = softmax entropy (URL appendix B).
Hyper-parameters: :mod:`bayesurl.recipes`; ``--help`` lists the options.
Run::

    python recipes/sop/ce.py --root DATA_ROOT --pretrained --device cuda
"""

from bayesurl.recipes import run_recipe_cli

if __name__ == "__main__":
    raise SystemExit(run_recipe_cli("ce", "sop"))
