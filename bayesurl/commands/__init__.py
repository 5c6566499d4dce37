"""Subcommands of the ``bayesurl`` CLI, one module each (see :mod:`bayesurl.cli`)."""

from __future__ import annotations

import re
from collections.abc import Mapping

__all__ = ["name_flags"]


def name_flags(message: str, flags: Mapping[str, str]) -> str:
    """``message`` with every backticked keyword of ``flags`` named by its flag.

    An option object names the keyword a Python caller typed (```image_size```); the command
    line shows the flag the user typed (```--image-size```). Only whole backticked names are
    replaced, so ```backbone.kwargs``` stays as it is.
    """
    return re.sub(r"`([\w.]+)`", lambda m: f"`{flags.get(m.group(1), m.group(1))}`", str(message))
