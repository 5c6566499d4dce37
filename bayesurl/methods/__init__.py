"""The eleven URL methods (URL benchmark, section 4.1 and appendix B) and their registry.

>>> import bayesurl.methods as m
>>> m.available()  # doctest: +SKIP
['ce', 'elk', 'ensemble', 'hetxl', 'hib', 'infonce', 'losspred', 'mcdropout', 'mcinfonce',
 'nivmf', 'sngp']

Each method module registers itself with :func:`register`; :func:`available` discovers them.
"""

from bayesurl.methods.base import Method, available, create, get, register, resolve_backbone

__all__ = ["Method", "available", "create", "get", "register", "resolve_backbone"]
