"""Input validation shared by every public function.

Every check raises :class:`ValueError` (or :class:`TypeError` for a non-tensor) whose message
names the offending argument, so bad input never turns into a silent NaN or a dropped row.
"""

from __future__ import annotations

import math
import numbers
import os
import re
from collections.abc import Sequence
from enum import Enum
from pathlib import Path
from typing import TypeVar

import torch
from torch import Tensor

__all__ = [
    "as_tensor",
    "check_choice",
    "check_concentration",
    "check_device",
    "check_finite",
    "check_floating",
    "check_input_file",
    "check_int",
    "check_labels",
    "check_ints",
    "check_ndim",
    "check_nonzero_rows",
    "check_number",
    "check_output_dir",
    "check_output_file",
    "check_same_length",
    "check_min_points",
    "check_tensor",
    "match_module_dtype",
    "parse_device",
    "resolve_device",
]


def as_tensor(x: object, name: str, dtype: torch.dtype | None = None) -> Tensor:
    """Convert ``x`` (tensor, numpy array or sequence) to a tensor, naming ``name`` on failure."""
    if isinstance(x, Tensor):
        return x if dtype is None else x.to(dtype)
    try:
        return torch.as_tensor(x, dtype=dtype)
    except Exception as exc:  # pragma: no cover - message path
        raise TypeError(f"`{name}` must be a tensor or array-like, got {type(x).__name__}") from exc


_E = TypeVar("_E", bound=Enum)


def check_enum(cls: type[_E], value: object, name: str) -> _E:
    """``value`` (a member of ``cls`` or a member's value) as the member; else raise naming
    ``name`` and the valid values."""
    try:
        return cls(getattr(value, "value", value))
    except ValueError:
        valid = ", ".join(str(m.value) for m in cls)
        raise ValueError(f"`{name}` must be one of {valid}, got {value!r}") from None


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


def check_columns(x: Tensor, name: str, n: int) -> None:
    """Raise unless ``x`` is 2-D with ``n`` columns (a head's input ``[N, D]``)."""
    check_ndim(x, name, 2)
    if x.shape[1] != n:
        raise ValueError(f"`{name}` must have {n} columns, got {x.shape[1]}")


#: Elements :func:`check_finite` tests at once. ``torch.isfinite`` of a float tensor builds an
#: ``abs`` copy and two boolean masks of its size; in blocks these temporaries stay a few MiB
#: instead of 1.5x the input (measured: 44 MiB of a 29 MiB shard of embeddings kept by
#: the allocator into the search's peak).
FINITE_BLOCK = 2**18


def check_finite(x: Tensor, name: str) -> None:
    """Raise if ``x`` holds NaN or +-inf (integer tensors always pass).

    Tested in blocks of :data:`FINITE_BLOCK` elements, so the check's temporary memory does not
    grow with ``x``; the counts of the error message are only computed on failure.
    """
    if x.is_floating_point() or x.is_complex():
        flat = x.reshape(-1)
        if flat.numel() <= FINITE_BLOCK:
            ok = torch.isfinite(flat).all()
        else:  # one device-side flag per block, one host sync
            ok = torch.stack([torch.isfinite(b).all() for b in flat.split(FINITE_BLOCK)]).all()
        if not bool(ok):
            bad = ~torch.isfinite(x)
            n_nan = int(torch.isnan(x).sum())
            n_inf = int(bad.sum()) - n_nan
            raise ValueError(
                f"`{name}` contains non-finite values ({n_nan} NaN, {n_inf} inf) "
                f"of {x.numel()} entries"
            )


def check_floating(x: Tensor, name: str) -> None:
    """Raise :class:`TypeError` naming ``name`` unless ``x`` is a floating-point tensor."""
    if not x.is_floating_point():
        raise TypeError(
            f"`{name}` must be a floating-point tensor, got {x.dtype} (convert it, e.g. "
            f"`{name}.float()`)"
        )


def check_integer(x: Tensor, name: str, what: str = "integers") -> None:
    """Raise ValueError naming ``name`` unless ``x`` has an integer dtype (not bool)."""
    if x.is_floating_point() or x.is_complex() or x.dtype == torch.bool:
        raise ValueError(f"`{name}` must hold {what}, got dtype {x.dtype}")


def check_nonzero_rows(x: Tensor, name: str) -> None:
    """Raise if a row of the 2-D ``x`` is all zeros (it has no direction: cosine undefined).

    Tested in blocks of about :data:`FINITE_BLOCK` elements, like :func:`check_finite`.
    """
    rows = max(1, FINITE_BLOCK // max(1, x.shape[1]))
    for start in range(0, x.shape[0], rows):
        zero = (x[start : start + rows] == 0).all(dim=1)
        if bool(zero.any()):
            first = (zero.nonzero().flatten()[:5] + start).tolist()
            raise ValueError(
                f"`{name}` has all-zero row(s) (e.g. rows {first}): a zero vector has no "
                "direction, so its cosine similarity is undefined"
            )


def check_same_length(*named: tuple[str, Tensor], dim: int = 0) -> None:
    """Raise if the tensors differ in size along ``dim``; names every argument."""
    sizes = [(n, t.shape[dim]) for n, t in named]
    if len({s for _, s in sizes}) > 1:
        desc = ", ".join(f"`{n}` has {s}" for n, s in sizes)
        raise ValueError(f"length mismatch along dim {dim}: {desc}")


def check_labels(y: object, n: int, name: str = "labels") -> Tensor:
    """Class labels ``[n]``: a 1-D tensor of ``n`` finite entries, else ValueError naming ``name``
    (a ``[n, 1]`` or one-hot ``[n, C]`` array would be broadcast into wrong pairs)."""
    t = as_tensor(y, name)
    if t.ndim != 1:
        raise ValueError(
            f"`{name}` must be 1-D class labels [N], got shape {tuple(t.shape)} (one-hot or "
            "[N, 1] labels: use .argmax(1) or .flatten())"
        )
    if t.shape[0] != n:
        raise ValueError(f"length mismatch: `{name}` has {t.shape[0]} entries, expected {n}")
    check_finite(t, name)
    return t


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


def check_concentration(
    kappa: Tensor | float,
    name: str,
    *,
    positive: bool = False,
    allow_inf: bool = True,
) -> Tensor:
    """Validate vMF concentrations (kappa); returns them as a floating tensor.

    The one kappa check of the package: the distributions, the losses and the heads call it.
    NaN always raises; negative values raise, zero too when ``positive``; infinity raises
    unless ``allow_inf``. Integer input becomes the default floating dtype; the device and a
    floating dtype are kept. Every error names ``name``.
    """
    k = torch.as_tensor(kappa)
    if not k.is_floating_point():
        k = k.to(torch.get_default_dtype())
    if bool(torch.isnan(k).any()):
        raise ValueError(f"`{name}` contains NaN")
    if not allow_inf and bool(torch.isinf(k).any()):
        raise ValueError(f"`{name}` must be finite here")
    if bool((k < 0).any()):
        raise ValueError(f"`{name}` must be non-negative, got min {float(k.min())}")
    if positive and bool((k == 0).any()):
        raise ValueError(f"`{name}` must be positive, got a zero")
    return k


# --------------------------------------------------------------------------------------------
# scalars


def check_number(
    value: object,
    name: str,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
) -> float:
    """Return ``value`` as a finite float within ``[low, high]`` (ends open when asked).

    Raises :class:`TypeError` for a non-number (``bool`` included) and :class:`ValueError` for
    NaN, inf or a value out of range; the message names ``name`` and the allowed range.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"`{name}` must be a number, got {type(value).__name__} {value!r}")
    v = float(value)
    if not math.isfinite(v):
        raise ValueError(f"`{name}` must be finite, got {v}")
    if low is not None and (v <= low if low_open else v < low):
        raise ValueError(f"`{name}` must be {'>' if low_open else '>='} {low}, got {value!r}")
    if high is not None and (v >= high if high_open else v > high):
        raise ValueError(f"`{name}` must be {'<' if high_open else '<='} {high}, got {value!r}")
    return v


def check_int(value: object, name: str, *, low: int | None = None, high: int | None = None) -> int:
    """Return ``value`` as an ``int`` within ``[low, high]``: the one whole-number check.

    Every count, size, seed and index of the package is checked here, so ``2.5`` is refused
    everywhere instead of being truncated to ``2`` somewhere. Whole numbers of any type pass
    (``3``, ``3.0``, numpy integers, a one-element tensor); a fractional or non-finite number,
    or a value below ``low`` / above ``high``, raises :class:`ValueError`; anything that is
    not a number (``"3"``, ``None``, ``True``) raises :class:`TypeError`. The message names
    ``name`` and the allowed range.
    """
    if isinstance(value, Tensor) and value.numel() == 1:
        value = value.item()
    bounds = (
        (f" >= {low}" if low is not None else "")
        + (" and" if low is not None and high is not None else "")
        + (f" <= {high}" if high is not None else "")
    )
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(
            f"`{name}` must be an integer{bounds}, got {type(value).__name__} {value!r}"
        )
    if not isinstance(value, numbers.Integral) and not (
        math.isfinite(float(value)) and float(value).is_integer()
    ):
        raise ValueError(f"`{name}` must be an integer{bounds}, got {value!r}")
    v = int(value)
    if (low is not None and v < low) or (high is not None and v > high):
        raise ValueError(f"`{name}` must be an integer{bounds}, got {v}")
    return v


def check_ints(
    values: object, name: str, *, low: int | None = None, high: int | None = None
) -> tuple[int, ...]:
    """Return a non-empty sequence of integers as a tuple, each checked by :func:`check_int`."""
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        if isinstance(values, Tensor) and values.ndim == 1:
            values = values.tolist()
        else:
            raise TypeError(f"`{name}` must be a sequence of integers, got {type(values).__name__}")
    if len(values) == 0:
        raise ValueError(f"`{name}` must not be empty")
    return tuple(check_int(v, f"{name}[{i}]", low=low, high=high) for i, v in enumerate(values))


# --------------------------------------------------------------------------------------------
# devices and paths (the command line validates these before any work starts)

#: The device name that leaves the choice to :func:`resolve_device` (as ``None`` does).
AUTO_DEVICE = "auto"


def check_device(text: str | torch.device | None, name: str = "device") -> torch.device | None:
    """Parse a device string and check that this machine has it.

    ``None`` or ``"auto"`` (the automatic choice, made by :func:`resolve_device` where the
    work runs) gives ``None``. ``"cpu"``, ``"cuda"``, ``"cuda:1"``, ``"mps"`` ... are accepted
    when present; an unparsable name, or CUDA / MPS on a machine without them, or a CUDA
    index beyond the device count, raises :class:`ValueError` naming ``name``.
    """
    if text is None or (isinstance(text, str) and text.strip().lower() == AUTO_DEVICE):
        return None
    dev = parse_device(text, name)
    if dev.type == "cuda":
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if n == 0:
            raise ValueError(f"`{name}` {str(dev)!r}: CUDA is not available here; use cpu")
        if dev.index is not None and dev.index >= n:
            raise ValueError(
                f"`{name}` {str(dev)!r}: only {n} CUDA device(s) exist (cuda:0..{n - 1})"
            )
    elif dev.type == "mps":
        mps = getattr(torch.backends, "mps", None)
        if mps is None or not mps.is_available():
            raise ValueError(f"`{name}` 'mps': MPS is not available here; use cpu")
    elif dev.type not in ("cpu", "meta"):
        backend = getattr(torch, dev.type, None)
        available = getattr(backend, "is_available", None)
        if available is None or not available():
            raise ValueError(f"`{name}` {str(dev)!r}: that device is not available here")
    return dev


def parse_device(text: str | torch.device, name: str = "device") -> torch.device:
    """``text`` as a :class:`torch.device`, whether or not this machine has it (a config
    made here may run on another machine); an unparsable name raises :class:`ValueError`
    naming ``name`` and the usual names."""
    if isinstance(text, torch.device):
        return text
    if not isinstance(text, str):
        raise TypeError(f"`{name}` must be a device name, got {type(text).__name__}")
    try:
        return torch.device(text.strip())
    except (RuntimeError, ValueError):
        raise ValueError(
            f"`{name}` {text!r} is not a device; use cpu, cuda, cuda:N or mps"
        ) from None


def resolve_device(device: str | torch.device | None = None, name: str = "device") -> torch.device:
    """The :class:`torch.device` to run on, checked on this machine.

    ``None`` or ``"auto"``: CUDA where this machine has it, else the CPU. Any other name
    (``"cpu"``, ``"cuda"``, ``"cuda:1"``, ``"mps"``) or :class:`torch.device` is read and
    checked by :func:`check_device`, whose errors name ``name``, the argument as the user
    typed it (``"--device"``, ``"device"``).

    Raises
    ------
    ValueError
        For an unparsable name or a device this machine lacks.
    TypeError
        If ``device`` is neither a name nor a :class:`torch.device`.
    """
    dev = check_device(device, name)
    if dev is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return dev


def _writable_ancestor(p: Path, name: str) -> None:
    """The nearest existing ancestor of ``p`` must be a writable directory."""
    parent = p.parent
    while not parent.exists():
        if parent.parent == parent:
            break
        parent = parent.parent
    if not parent.is_dir():
        raise ValueError(f"`{name}` {str(p)!r}: {str(parent)!r} is a file, not a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"`{name}` {str(p)!r}: folder {str(parent)!r} is not writable")


def check_output_dir(path: str | os.PathLike[str], name: str, *, create: bool = False) -> Path:
    """Check that ``path`` can be used as an output folder; returns it as a :class:`Path`.

    An existing file at ``path`` (or at one of its parents), or a non-writable folder, raises
    :class:`ValueError` naming ``name``. With ``create=True`` the folder is made.
    """
    p = Path(os.fspath(path)).expanduser()
    if str(p) == "":
        raise ValueError(f"`{name}` must not be empty")
    if p.exists():
        if not p.is_dir():
            raise ValueError(f"`{name}` {str(p)!r} is a file; give a folder")
        if not os.access(p, os.W_OK | os.X_OK):
            raise ValueError(f"`{name}` folder {str(p)!r} is not writable")
    else:
        _writable_ancestor(p, name)
        if create:
            p.mkdir(parents=True, exist_ok=True)
    return p


def check_output_file(
    path: str | os.PathLike[str], name: str, *, suffix: str | Sequence[str] | None = None
) -> Path:
    """Check that a file can be written at ``path`` (nothing is written); returns the path.

    A folder at ``path``, a file where a parent folder should be, a non-writable location or
    (with ``suffix``) a wrong extension raises :class:`ValueError` naming ``name``. Missing
    parent folders are fine (the writer creates them).
    """
    p = Path(os.fspath(path)).expanduser()
    if str(p) in ("", "."):
        raise ValueError(f"`{name}` must be a file name")
    if p.is_dir():
        raise ValueError(f"`{name}` {str(p)!r} is a folder; give a file name")
    if suffix is not None:
        allowed = (suffix,) if isinstance(suffix, str) else tuple(suffix)
        if p.suffix.lower() not in allowed:
            raise ValueError(f"`{name}` {str(p)!r} must end in {' or '.join(allowed)}")
    if p.exists():
        if not os.access(p, os.W_OK):
            raise ValueError(f"`{name}` file {str(p)!r} is not writable")
    else:
        _writable_ancestor(p, name)
    return p


def check_input_file(path: str | os.PathLike[str], name: str) -> Path:
    """Return ``path`` if it is an existing file; else :class:`FileNotFoundError` naming ``name``
    (or :class:`ValueError` when it is a folder)."""
    p = Path(os.fspath(path)).expanduser()
    if p.is_dir():
        raise ValueError(f"`{name}` {str(p)!r} is a folder, not a file")
    if not p.is_file():
        raise FileNotFoundError(f"`{name}` {str(p)!r} does not exist")
    return p


def match_module_dtype(x: object, module: torch.nn.Module) -> object:
    """``x`` cast to the floating dtype of ``module``'s parameters (other inputs unchanged).

    A float64 batch into a float32 model (or the reverse) would otherwise fail inside the
    model's first matmul; a frozen model defines the precision it computes in. Integer
    inputs (e.g. ``uint8`` images) and modules without floating parameters are left alone.
    """
    if not isinstance(x, Tensor) or not x.is_floating_point():
        return x
    for p in module.parameters():
        if p.is_floating_point():
            return x if p.dtype == x.dtype else x.to(p.dtype)
    return x


def load_refusal(path: str | os.PathLike[str], exc: BaseException, label: str) -> str:
    """Why ``torch.load(path, weights_only=True)`` failed, in one line that starts with
    ``label`` (the file as the user gave it, e.g. ``"checkpoint 'x.pt'"``).

    torch's own messages advise loading the file unsafely (``weights_only=False``, or
    allowlisting its classes); a file bayesurl did not write is not to be trusted that way, so
    that advice is never passed on.
    """
    with open(path, "rb") as fh:
        head = fh.read(4)
    if not head.startswith((b"PK", b"\x80")):
        # torch.save writes a zip archive (a pickle of protocol 2 or above in its legacy format)
        return f"{label} is not a checkpoint: no file torch.save writes"
    text = str(exc)
    found = re.search(r"Unsupported global: GLOBAL ([\w.]+)", text)
    if found:
        return (
            f"{label} holds a {found.group(1)} object; bayesurl loads only tensors, numbers, "
            "strings and plain containers from a file"
        )
    if "weights only" in text.lower() or "weights_only" in text:
        return (
            f"{label} holds objects other than tensors, numbers, strings and plain containers, "
            "which bayesurl does not load"
        )
    first = text.strip().splitlines()[0] if text.strip() else ""
    return (
        f"{label} is corrupted or truncated ({type(exc).__name__}{': ' + first if first else ''})"
    )
