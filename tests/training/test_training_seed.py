"""Seeding and RNG snapshots: every generator a run draws from is captured and restored."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from _training_toys import NoisyMLP, loader

from bayesurl.training import fit, get_rng_state, seed_everything, set_rng_state


def _draws():
    return (
        torch.rand(3).tolist(),
        np.random.rand(3).tolist(),  # noqa: NPY002
        [random.random() for _ in range(3)],
        random.gauss(0, 1),
        np.random.randn(),  # noqa: NPY002
    )


def test_rng_snapshot_round_trip_through_weights_only(tmp_path):
    seed_everything(3)
    random.gauss(0, 1)  # leaves a cached Gaussian in Python's generator
    np.random.randn()  # noqa: NPY002 - and one in numpy's
    state = get_rng_state()
    torch.save(state, tmp_path / "rng.pt")
    expected = _draws()
    seed_everything(99)
    set_rng_state(torch.load(tmp_path / "rng.pt", weights_only=True))
    assert _draws() == expected


def test_same_seed_same_run_different_seed_different_run():
    def run(seed):
        torch.manual_seed(0)
        m = NoisyMLP()
        fit(
            m, loader(shuffle=True), epochs=1, optimizer="adamw", lr=1e-2, seed=seed, progress=False
        )
        return torch.cat([p.flatten() for p in m.parameters()])

    a, b, c = run(1), run(1), run(2)
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_bad_seed_and_state():
    for bad in (-1, 2**32, 1.5):
        with pytest.raises(ValueError, match="`seed` must be an integer >= 0 and <= 4294967295"):
            seed_everything(bad)
    for bad in (True, "3", None):
        with pytest.raises(TypeError, match="`seed` must be an integer"):
            seed_everything(bad)
    with pytest.raises(ValueError, match="numpy, python"):
        set_rng_state({"torch": torch.get_rng_state()})
