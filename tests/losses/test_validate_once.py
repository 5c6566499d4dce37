"""Validation once, at the public entry (PML's ``forward`` -> ``compute_loss``).

Every value check (NaN / inf / sign scans: each one a host sync on a GPU) is recorded with a
profiler hook while a loss or a method runs; no tensor may be scanned twice in one call.
Checks nested inside another check (``check_embeddings`` -> ``check_finite``) count as one.
It fails when a loss checks again inside (``ELKLoss`` in ``elk_pairwise_log_kernel``, the
sampling losses in ``sample_vmf``).
"""

from __future__ import annotations

import sys
from collections import Counter

import pytest
import torch

import bayesurl._checks as checks
import bayesurl.losses._base as base
import bayesurl.methods as M
from bayesurl.losses import (
    ELKLoss,
    HIBLoss,
    MCInfoNCELoss,
    NivMFLoss,
    elk_contrastive_loss,
    mcinfonce_loss,
    nivmf_loss,
)
from bayesurl.losses.elk import elk_proxy_loss
from bayesurl.losses.hib import hib_loss

#: the checks that read tensor values (the ones worth doing once)
_VALUE_CHECKS = {
    f.__code__
    for f in (
        checks.check_finite,
        checks.check_tensor,
        base.check_embeddings,
        base.check_kappa,
        checks.check_concentration,
    )
}


class _Recorder:
    """Tensors handed to a value check, outermost checks only (references kept: no id reuse)."""

    def __init__(self) -> None:
        self.seen: dict[int, tuple[torch.Tensor, list[str]]] = {}
        self.depth = 0

    def __call__(self, frame, event, arg):  # noqa: ANN001, ANN204
        if frame.f_code not in _VALUE_CHECKS:
            return
        if event == "call":
            if self.depth == 0:
                first = frame.f_locals.get(frame.f_code.co_varnames[0])
                if isinstance(first, torch.Tensor):
                    t, names = self.seen.setdefault(id(first), (first, []))
                    names.append(frame.f_code.co_name)
            self.depth += 1
        elif event == "return":
            self.depth -= 1

    def repeated(self) -> list[tuple[tuple[int, ...], list[str]]]:
        return [(tuple(t.shape), names) for t, names in self.seen.values() if len(names) > 1]


def _record(fn):
    rec = _Recorder()
    old = sys.getprofile()
    sys.setprofile(rec)
    try:
        fn()
    finally:
        sys.setprofile(old)
    return rec


def _data(n=12, d=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    e = torch.randn(n, d, generator=g, dtype=torch.float64)
    kappa = torch.rand(n, generator=g, dtype=torch.float64) * 20 + 1
    return e, torch.arange(n) % 3, kappa


def test_recorder_sees_a_repeated_check():
    # the reference: a tensor checked twice by hand is reported, nested checks count once
    e, _, _ = _data()

    def twice():
        base.check_embeddings(e, "e")  # calls check_finite inside: one check
        checks.check_finite(e, "e")

    assert _record(twice).repeated() == [((12, 8), ["check_embeddings", "check_finite"])]
    assert _record(lambda: base.check_embeddings(e, "e")).repeated() == []


LOSSES = {
    "elk": lambda: ELKLoss(3, 8).double(),
    "nivmf": lambda: NivMFLoss(3, 8).double(),
    "mcinfonce": lambda: MCInfoNCELoss(),
    "hib": lambda: HIBLoss(),
}


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_pml_losses_check_each_input_once(name):
    e, y, kappa = _data()
    loss = LOSSES[name]()
    e.requires_grad_(True)
    rec = _record(lambda: loss(e, y, kappa=kappa).backward())
    assert rec.repeated() == []
    # every input was checked at least once (forward is the entry)
    assert id(e) in rec.seen and id(kappa) in rec.seen
    if name in ("mcinfonce", "hib"):  # ref_emb path
        r, ry, rk = _data(seed=1)
        rec = _record(lambda: loss(e, y, ref_emb=r, ref_labels=ry, kappa=kappa, ref_kappa=rk))
        assert rec.repeated() == []
        assert {id(e), id(kappa), id(r), id(rk)} <= set(rec.seen)


def test_functional_losses_check_each_input_once():
    e, y, kappa = _data()
    a, p, ka, kp = e[:6], e[6:], kappa[:6], kappa[6:]
    neg = torch.randn(6, 3, 8, dtype=torch.float64)
    kn = torch.full((6, 3), 5.0, dtype=torch.float64)
    pm = torch.randn(3, 8, dtype=torch.float64)
    pk = torch.rand(3, 8, dtype=torch.float64) + 0.5
    calls = {
        "mcinfonce": lambda: mcinfonce_loss(a, ka, p, kp),
        "mcinfonce_neg": lambda: mcinfonce_loss(a, ka, p, kp, neg, kn),
        "hib": lambda: hib_loss(a, ka, p, kp),
        "hib_neg": lambda: hib_loss(a, ka, p, kp, neg, kn),
        "elk_contrastive": lambda: elk_contrastive_loss(a, ka, p, kp),
        "elk_contrastive_neg": lambda: elk_contrastive_loss(a, ka, p, kp, neg, kn),
        "elk_proxy": lambda: elk_proxy_loss(e, kappa, y, pm, pk[:, 0]),
        "nivmf": lambda: nivmf_loss(e, kappa, y, pm, pk),
    }
    for name, call in calls.items():
        assert _record(call).repeated() == [], name


@pytest.mark.parametrize("name", M.available())
def test_methods_check_each_tensor_once(name):
    torch.manual_seed(0)
    m = M.create(name, embed_dim=8, num_classes=3, backbone_kwargs={"width": 4, "num_features": 8})
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 1, 28, 28, generator=g)
    y = torch.arange(6) % 3
    batch = ((x, x.flip(-1)), y) if m.two_view else (x, y)
    rec = _record(lambda: m.train().training_loss(batch))
    assert rec.repeated() == []
    assert rec.seen, "the batch was not checked at all"
    n_samples = 3 if m.has_distribution else 0
    with torch.no_grad():
        rec = _record(lambda: m.eval()(x, n_samples=n_samples))
    assert rec.repeated() == []
    assert Counter(names[0] for _, names in rec.seen.values())["check_finite"] >= 1


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_zero_direction_is_refused_at_the_entry(name):
    # sample_vmf refuses an all-zero mean direction; the losses, which sample through the
    # unchecked core, refuse it once at their entry (with kappa read from the norm, a zero
    # row has kappa = 0: uniform, no direction needed)
    e, y, kappa = _data()
    e[4] = 0.0
    with pytest.raises(ValueError, match="all-zero embedding row"):
        LOSSES[name]()(e, y, kappa=kappa)
    assert torch.isfinite(LOSSES[name]()(e, y))
    with pytest.raises(ValueError, match="all-zero embedding row"):
        mcinfonce_loss(e[:6], kappa[:6], e[6:], kappa[6:])
    with pytest.raises(ValueError, match="all-zero embedding row"):
        hib_loss(e[6:], kappa[6:], e[:6], kappa[:6])
