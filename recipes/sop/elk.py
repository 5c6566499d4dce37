"""Recipe: elk on Stanford Online Products.

ELK: expected likelihood kernel to vMF class proxies (URL appendix B).
Hyper-parameters: :mod:`bayesurl.recipes`; ``--help`` lists the options.
Run::

    python recipes/sop/elk.py --root DATA_ROOT --pretrained --device cuda
"""

from bayesurl.recipes import run_recipe_cli

if __name__ == "__main__":
    raise SystemExit(run_recipe_cli("elk", "sop"))
