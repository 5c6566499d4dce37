"""Seeding and random-number-generator states as plain tensors.

Bit-identical resume needs every generator a run draws from -- torch CPU,
CUDA, numpy, Python's :mod:`random` and a data loader's own generator -- saved at the end of an
epoch and restored before the next. The states are stored as tensors, lists and numbers so a
checkpoint loads with ``torch.load(..., weights_only=True)``.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch

from bayesurl._checks import check_int

__all__ = ["get_rng_state", "seed_everything", "set_rng_state"]


def seed_everything(seed: int) -> int:
    """Seed Python's :mod:`random`, numpy's global generator, torch CPU and every CUDA device.

    Parameters
    ----------
    seed : int
        A non-negative integer below ``2**32``.

    Returns
    -------
    int
        ``seed``, for logging.

    Raises
    ------
    ValueError
        If ``seed`` is a number but not a whole one in ``[0, 2**32)``.
    TypeError
        If it is not a number (``"3"``, ``None``, ``True``).
    """
    seed = check_int(seed, "seed", low=0, high=2**32 - 1)
    random.seed(seed)
    np.random.seed(seed)  # noqa: NPY002 - the legacy global generator is what user code draws from
    torch.manual_seed(seed)  # also seeds every CUDA device
    return seed


def get_rng_state() -> dict[str, Any]:
    """Snapshot of the torch CPU, CUDA, numpy and Python generators as plain tensors/numbers."""
    np_name, np_keys, np_pos, np_has_gauss, np_cached = np.random.get_state()  # noqa: NPY002
    py_version, py_state, py_gauss = random.getstate()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "numpy": {
            "name": str(np_name),
            "keys": torch.from_numpy(np.asarray(np_keys, dtype=np.int64).copy()),
            "pos": int(np_pos),
            "has_gauss": int(np_has_gauss),
            "cached_gaussian": float(np_cached),
        },
        "python": {
            "version": int(py_version),
            "state": torch.tensor(py_state, dtype=torch.int64),
            "gauss_next": None if py_gauss is None else float(py_gauss),
        },
    }


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore generators from :func:`get_rng_state`'s snapshot.

    CUDA states are restored only when CUDA is available and the number of devices matches.

    Raises
    ------
    ValueError
        If ``state`` lacks one of the keys ``torch``, ``numpy``, ``python``.
    """
    missing = [k for k in ("torch", "numpy", "python") if k not in state]
    if missing:
        raise ValueError(f"`state` is missing RNG entries: {', '.join(missing)}")
    torch.set_rng_state(state["torch"].cpu())
    cuda = state.get("cuda") or []
    if cuda and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all([s.cpu() for s in cuda])
    npst = state["numpy"]
    np.random.set_state(  # noqa: NPY002
        (
            npst["name"],
            npst["keys"].numpy().astype(np.uint32),
            int(npst["pos"]),
            int(npst["has_gauss"]),
            float(npst["cached_gaussian"]),
        )
    )
    py = state["python"]
    random.setstate(
        (int(py["version"]), tuple(int(v) for v in py["state"].tolist()), py["gauss_next"])
    )
