"""fit's settings as one object: FitOptions is checked when built, the options form and the
keyword form train bit for bit alike, and both equal a hand-written loop."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F
from _training_toys import LinearCE, NoisyMLP, blobs, loader

from bayesurl.training import AmpMode, Checkpointing, FitOptions, fit, load_checkpoint

URL_LIKE = {
    "epochs": 2, "optimizer": "lamb", "lr": 2e-2, "weight_decay": 1e-3, "warmup_epochs": 0.5,
    "min_lr": 1e-4, "grad_accum": 2, "clip_grad": 0.5, "seed": 3, "progress": False,
}  # fmt: skip


def _train(tmp_path, name, *args, **kw):
    torch.manual_seed(0)
    method = NoisyMLP()  # draws from torch, numpy and Python RNGs in its loss
    hooks = [Checkpointing(tmp_path / name)]
    result = fit(method, loader(n=40, batch_size=8, shuffle=True), *args, hooks=hooks, **kw)
    return method, result, load_checkpoint(tmp_path / name / "last.pt")


def test_options_and_keywords_train_bit_identically(tmp_path) -> None:
    kw_m, kw_res, kw_ck = _train(tmp_path, "kw", **URL_LIKE)
    opt_m, opt_res, opt_ck = _train(tmp_path, "opts", FitOptions(**URL_LIKE))
    # a setting beside the options replaces its field
    base = FitOptions(**{**URL_LIKE, "epochs": 5, "lr": 1.0})
    rep_m, rep_res, rep_ck = _train(tmp_path, "replaced", base, epochs=2, lr=2e-2)
    for m, res, ck in ((opt_m, opt_res, opt_ck), (rep_m, rep_res, rep_ck)):
        assert res.losses == kw_res.losses and res.lrs == kw_res.lrs
        for (ka, a), (kb, b) in zip(kw_m.state_dict().items(), m.state_dict().items(), strict=True):
            assert ka == kb and torch.equal(a, b)
        assert ck["config"] == kw_ck["config"] and ck["method"] == kw_ck["method"]
        assert ck["config"]["amp"] == "auto" and ck["config"]["optimizer"] == "lamb"


def _factor(t: int, total: int, warmup: int, min_factor: float) -> float:
    """Linear warm-up over ``warmup`` steps, then cosine from 1 to ``min_factor``."""
    if t < warmup:
        return (t + 1) / warmup
    return (
        min_factor
        + (1 - min_factor) * (1 + math.cos(math.pi * (t - warmup) / (total - warmup))) / 2
    )


def test_options_equal_a_hand_written_loop() -> None:
    """AdamW with warm-up, cosine to min_lr, accumulation with a short last group and
    gradient clipping, written out by hand (float64)."""
    torch.manual_seed(1)
    m = LinearCE()
    ref = LinearCE()
    ref.load_state_dict(m.state_dict())
    lr, min_lr, accum, clip, epochs = 0.05, 0.005, 2, 0.3, 3
    opts = FitOptions(
        epochs=epochs, optimizer="adamw", lr=lr, min_lr=min_lr, weight_decay=0.01,
        warmup_steps=2, grad_accum=accum, clip_grad=clip, progress=False,
        optimizer_kwargs={"betas": (0.8, 0.95)},
    )  # fmt: skip
    fit(m, loader(n=40, batch_size=8), opts)

    x, y = blobs(40)
    batches = [(x[s : s + 8], y[s : s + 8]) for s in range(0, 40, 8)]
    groups = [batches[i : i + accum] for i in range(0, len(batches), accum)]  # 2, 2, 1
    total = epochs * len(groups)
    adamw = torch.optim.AdamW(ref.parameters(), lr=lr, weight_decay=0.01, betas=(0.8, 0.95))
    t = 0
    for _ in range(epochs):
        for group in groups:
            adamw.param_groups[0]["lr"] = lr * _factor(t, total, 2, min_lr / lr)
            adamw.zero_grad()
            for xb, yb in group:
                (F.cross_entropy(ref.linear(xb), yb) / len(group)).backward()
            torch.nn.utils.clip_grad_norm_(ref.parameters(), clip)
            adamw.step()
            t += 1
    for a, b in zip(m.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(a.detach(), b.detach(), rtol=0, atol=1e-12)


@pytest.mark.parametrize(
    ("bad", "name"),
    [
        ({"epochs": 0}, "epochs"),
        ({"epochs": 2.5}, "epochs"),
        ({"grad_accum": 0}, "grad_accum"),
        ({"warmup_steps": -1}, "warmup_steps"),
        ({"warmup_epochs": float("inf")}, "warmup_epochs"),
        ({"lr": -1.0}, "lr"),
        ({"lr": 1e-3, "min_lr": 1e-2}, "min_lr"),
        ({"weight_decay": float("nan")}, "weight_decay"),
        ({"clip_grad": 0.0}, "clip_grad"),
        ({"optimizer": "rmsprop"}, "optimizer"),
        ({"amp": "fp8"}, "amp"),
        ({"method_kwargs": {"backbone": torch.nn.Linear(1, 1)}}, "method_kwargs"),
        ({"device": "no_such_device"}, "device"),
    ],
)
def test_bad_settings_fail_when_built_naming_them(bad, name) -> None:
    with pytest.raises(ValueError, match=name):
        FitOptions(**bad)
    with pytest.raises(ValueError, match=name):  # and before any training when replaced
        dataclasses.replace(FitOptions(), **bad)


def test_options_are_frozen_and_normalised() -> None:
    opts = FitOptions(amp="BF16", device="cpu", method_kwargs={"in_dim": 6})
    assert opts.amp is AmpMode.BF16 and opts.device == torch.device("cpu")
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.lr = 1.0  # type: ignore[misc]


def test_fit_refuses_other_options_and_unknown_keywords() -> None:
    with pytest.raises(TypeError, match="`options` must be a FitOptions"):
        fit(LinearCE(), loader(), {"epochs": 1})
    with pytest.raises(TypeError, match="unexpected keyword argument 'epoch'"):
        fit(LinearCE(), loader(), FitOptions(), epoch=2)
    with pytest.raises(ValueError, match="`min_lr`"):  # a replaced field is checked again
        fit(LinearCE(), loader(), FitOptions(lr=1e-2, min_lr=1e-3), lr=1e-4)
