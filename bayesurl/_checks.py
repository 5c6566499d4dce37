"""Input validation shared by every public function.

Every check raises :class:`ValueError` (or :class:`TypeError` for a non-tensor) whose message
names the offending argument, so bad input never turns into a silent NaN or a dropped row.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

__all__ = [
    "as_tensor",
    "check_choice",
    "check_finite",
    "check_ndim",
    "check_same_length",
    "check_min_points",
    "check_tensor",
]


def as_tensor(x: object, name: str, dtype: torch.dtype | None = None) -> Tensor:
    """Convert ``x`` (tensor, numpy array or sequence) to a tensor, naming ``name`` on failure."""
    if isinstance(x, Tensor):
        return x if dtype is None else x.to(dtype)
    try:
        return torch.as_tensor(x, dtype=dtype)
    except Exception as exc:  # pragma: no cover - message path
        raise TypeError(f"`{name}` must be a tensor or array-like, got {type(x).__name__}") from exc


def check_choice(value: str, name: str, choices: Sequence[str]) -> str:
    """Return ``value`` if it is one of ``choices``; else raise naming ``name`` and the choices."""
    if value not in choices:
        raise ValueError(f"`{name}` must be one of {', '.join(choices)}, got {value!r}")
    return value


def check_ndim(x: Tensor, name: str, ndim: int | Sequence[int]) -> None:
    """Raise if ``x.ndim`` is not ``ndim`` (or one of them)."""
    allowed = (ndim,) if isinstance(ndim, int) else tuple(ndim)
    if x.ndim not in allowed:
        want = " or ".join(f"{d}-D" for d in allowed)
        raise ValueError(f"`{name}` must be {want}, got shape {tuple(x.shape)}")


def check_finite(x: Tensor, name: str) -> None:
    """Raise if ``x`` holds NaN or +-inf (integer tensors always pass)."""
    if x.is_floating_point() or x.is_complex():
        bad = ~torch.isfinite(x)
        if bool(bad.any()):
            n_nan = int(torch.isnan(x).sum())
            n_inf = int(bad.sum()) - n_nan
            raise ValueError(
                f"`{name}` contains non-finite values ({n_nan} NaN, {n_inf} inf) "
                f"of {x.numel()} entries"
            )


def check_same_length(*named: tuple[str, Tensor], dim: int = 0) -> None:
    """Raise if the tensors differ in size along ``dim``; names every argument."""
    sizes = [(n, t.shape[dim]) for n, t in named]
    if len({s for _, s in sizes}) > 1:
        desc = ", ".join(f"`{n}` has {s}" for n, s in sizes)
        raise ValueError(f"length mismatch along dim {dim}: {desc}")


def check_min_points(x: Tensor, name: str, minimum: int = 2) -> None:
    """Raise if ``x`` has fewer than ``minimum`` rows."""
    if x.shape[0] < minimum:
        raise ValueError(f"`{name}` needs at least {minimum} points, got {x.shape[0]}")


def check_tensor(
    x: object,
    name: str,
    *,
    ndim: int | Sequence[int] | None = None,
    finite: bool = True,
    min_points: int | None = None,
    dtype: torch.dtype | None = None,
) -> Tensor:
    """Convert and validate in one call; returns the tensor."""
    t = as_tensor(x, name, dtype)
    if ndim is not None:
        check_ndim(t, name, ndim)
    if finite:
        check_finite(t, name)
    if min_points is not None:
        check_min_points(t, name, min_points)
    return t
