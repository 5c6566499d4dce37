"""Subcommands of the ``bayesurl`` CLI, one module each (see :mod:`bayesurl.cli`)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

__all__ = ["name_flags", "name_set_overrides"]


def name_flags(message: str, flags: Mapping[str, str]) -> str:
    """``message`` with every backticked keyword of ``flags`` named by its flag.

    An option object names the keyword a Python caller typed (```image_size```); the command
    line shows the flag the user typed (```--image-size```). Only whole backticked names are
    replaced, so ```backbone.kwargs``` stays as it is.
    """
    return re.sub(r"`([\w.]+)`", lambda m: f"`{flags.get(m.group(1), m.group(1))}`", str(message))


def name_set_overrides(message: str, overrides: Iterable[str] | None) -> str:
    """``message`` with the ``--set estimator.KEY=VALUE`` it came from, where it names one.

    ``--set estimator.KEY=VALUE`` reaches every estimator's table, so the checks that refuse
    it name the table they read (```estimators.ce.kwargs.nope```); the user typed
    ``estimator.kwargs.nope``, which this appends.
    """
    for item in overrides or ():
        key = str(item).split("=", 1)[0].strip()
        if not key.startswith("estimator."):
            continue
        rest = re.escape(key[len("estimator.") :])
        if re.search(rf"`estimators\.[^.`]+\.{rest}`", str(message)):
            return f"{message} (from `--set {item}`, applied to every estimator)"
    return str(message)
