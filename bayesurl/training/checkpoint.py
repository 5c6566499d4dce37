"""Training checkpoints that load with ``torch.load(..., weights_only=True)``.

A checkpoint is a dict of tensors, dicts, lists, strings and numbers only:

=================  ==========================================================================
``format``         ``"bayesurl-checkpoint"``; ``version``: :data:`CHECKPOINT_VERSION`
``method``         ``{"name": registry name, "kwargs": constructor keyword arguments}``
``model``          the method's ``state_dict``
``optimizer``      optimiser ``state_dict``; ``scheduler`` and ``scaler`` likewise
``epoch``          number of completed epochs; ``global_step``: optimiser steps taken
``rng``            torch / CUDA / numpy / Python generator states (:mod:`.seed`), per rank
``loader``         the data loader's and sampler's generator states and the sampler epoch
``history``        per-epoch records (loss, learning rate, time, eval results)
``config``         the :class:`~bayesurl.training.FitOptions` settings that shape the run
=================  ==========================================================================

Files are written to a temporary name and renamed, so an interrupted save never leaves a
truncated ``last.pt``.
"""

from __future__ import annotations

import os
import pickle
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from bayesurl._checks import load_refusal
from bayesurl.files import atomic_open
from bayesurl.methods.base import Method

__all__ = [
    "CHECKPOINT_FORMAT",
    "CHECKPOINT_VERSION",
    "RESUME_KEYS",
    "check_serialisable",
    "load_checkpoint",
    "load_method_from_checkpoint",
    "save_checkpoint",
]

CHECKPOINT_FORMAT = "bayesurl-checkpoint"
CHECKPOINT_VERSION = 1
#: keys every checkpoint has
REQUIRED_KEYS = ("format", "version", "method", "model", "epoch", "global_step")
#: keys a checkpoint needs to resume training
RESUME_KEYS = (*REQUIRED_KEYS, "optimizer", "scheduler", "scaler", "rng", "loader", "config")


def check_serialisable(value: Any, name: str) -> None:
    """Raise ValueError if ``value`` holds anything ``weights_only`` loading would reject.

    Allowed: None, bool, int, float, str, tensors, and lists / tuples / dicts (with str or int
    keys) of those. ``name`` is the argument named in the message.
    """
    if value is None or isinstance(value, (bool, int, float, str, torch.Tensor)):
        return
    if isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            check_serialisable(v, f"{name}[{i}]")
        return
    if isinstance(value, Mapping):
        for k, v in value.items():
            if not isinstance(k, (str, int)):
                raise ValueError(f"`{name}` has a key of type {type(k).__name__}: {k!r}")
            check_serialisable(v, f"{name}[{k!r}]")
        return
    raise ValueError(
        f"`{name}` is a {type(value).__name__}, which a weights_only checkpoint cannot hold "
        "(use names and numbers, e.g. a timm model name instead of a module)"
    )


def save_checkpoint(state: Mapping[str, Any], path: str | os.PathLike[str]) -> Path:
    """Write ``state`` to ``path`` atomically (temporary file + rename); returns the path.

    Raises
    ------
    ValueError
        If ``state`` holds an object a ``weights_only`` load would reject.
    """
    check_serialisable(dict(state), "state")
    path = Path(path)
    with atomic_open(path, "wb") as fh:
        torch.save(dict(state), fh)
    return path


def load_checkpoint(
    path: str | os.PathLike[str],
    *,
    map_location: str | torch.device | None = "cpu",
    require: tuple[str, ...] = REQUIRED_KEYS,
) -> dict[str, Any]:
    """Load a checkpoint with ``torch.load(path, weights_only=True)`` and check its keys.

    Parameters
    ----------
    path : path-like
        A file written by :func:`save_checkpoint` (``checkpoint_dir/last.pt`` of a run).
    map_location : str, torch.device or None
        Where tensors are loaded; CPU by default.
    require : tuple of str
        Keys that must be present (:data:`RESUME_KEYS` to resume training).

    Returns
    -------
    dict

    Raises
    ------
    FileNotFoundError
        If ``path`` does not exist.
    ValueError
        If the file is corrupted or truncated, holds objects other than tensors and plain
        containers, is not a bayesurl checkpoint, or lacks a required key; the message names
        ``path``.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {str(path)!r} does not exist")
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True)
    except (
        RuntimeError,
        pickle.UnpicklingError,
        EOFError,
        zipfile.BadZipFile,
        OSError,
        ValueError,
        KeyError,
        AttributeError,
        TypeError,
        IndexError,
    ) as exc:
        raise ValueError(load_refusal(path, exc, f"checkpoint {str(path)!r}")) from exc
    if not isinstance(ckpt, dict) or ckpt.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"checkpoint {str(path)!r} is not a bayesurl training checkpoint")
    missing = [k for k in (*require, "version") if k not in ckpt]
    if missing:
        raise ValueError(f"checkpoint {str(path)!r} is missing keys: {', '.join(missing)}")
    if int(ckpt["version"]) > CHECKPOINT_VERSION:
        raise ValueError(
            f"checkpoint {str(path)!r} has version {ckpt['version']}; this bayesurl reads up to "
            f"{CHECKPOINT_VERSION}"
        )
    return ckpt


def load_method_from_checkpoint(
    path: str | os.PathLike[str],
    *,
    map_location: str | torch.device | None = "cpu",
    **override_kwargs: Any,
) -> Method:
    """Rebuild the trained method of a checkpoint from its registry name and kwargs.

    The method is created with ``bayesurl.methods.create(name, **kwargs)`` (timm backbones by
    name, random init), its weights are loaded strictly, and it is put in eval mode -- ready for
    zero-shot evaluation (URL section 3.2).

    Parameters
    ----------
    path : path-like
        A checkpoint written by :func:`bayesurl.training.fit` or ``bayesurl train``.
    map_location : str, torch.device or None
        Device of the returned method (CPU by default).
    **override_kwargs
        Replace stored constructor arguments (e.g. a local ``checkpoint_path`` for timm).

    Returns
    -------
    Method

    Raises
    ------
    ValueError
        If the checkpoint is unreadable, names no registered method, or its weights do not fit
        the rebuilt method; the message names ``path``.
    """
    from bayesurl.methods import get

    ckpt = load_checkpoint(path, map_location=map_location)
    spec = ckpt["method"]
    name = spec.get("name") if isinstance(spec, dict) else None
    kwargs = spec.get("kwargs") if isinstance(spec, dict) else None
    if not name or kwargs is None:
        raise ValueError(
            f"checkpoint {str(path)!r} does not record a registered method name and its "
            "constructor kwargs (pass `method_kwargs` to fit)"
        )
    try:
        cls = get(name)
    except ValueError as exc:
        raise ValueError(f"checkpoint {str(path)!r}: {exc}") from None
    if not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs):
        raise ValueError(f"checkpoint {str(path)!r}: its method kwargs are not a dict of names")
    from bayesurl.methods.base import constructor_options

    valid = constructor_options(cls)
    unknown = sorted(set(kwargs) - set(valid))
    if unknown:  # a tampered or foreign record: name the keys, list the valid ones
        raise ValueError(
            f"checkpoint {str(path)!r}: method {name!r} has no option(s) {unknown}; "
            f"valid: {', '.join(valid)}"
        )
    try:
        method = cls(**{**kwargs, **override_kwargs})
    except (TypeError, ValueError) as exc:
        raise ValueError(
            f"checkpoint {str(path)!r}: its constructor options do not build method {name!r}: {exc}"
        ) from None
    try:
        method.load_state_dict(ckpt["model"])
    except RuntimeError as exc:
        raise ValueError(
            f"checkpoint {str(path)!r}: weights do not fit method {name!r}: {exc}"
        ) from None
    if map_location is not None:
        method.to(map_location)
    return method.eval()
