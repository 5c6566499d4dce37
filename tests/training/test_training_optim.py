"""Optimisers, the warm-up + cosine schedule and the step decay against torch's schedulers."""

from __future__ import annotations

import math

import pytest
import torch
from _training_toys import LinearCE, loader
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.optim.lr_scheduler import (
    CosineAnnealingLR,
    LambdaLR,
    LinearLR,
    MultiStepLR,
    SequentialLR,
)

from bayesurl.training import (
    MultiStep,
    build_optimizer,
    build_scheduler,
    even_milestones,
    fit,
    multistep_factor,
    warmup_cosine_factor,
)


def _reference_lrs(lr: float, total: int, warmup: int, min_lr: float) -> list[float]:
    """Independent reference: torch's LinearLR warm-up chained with CosineAnnealingLR."""
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=lr)
    cos = CosineAnnealingLR(opt, T_max=total - warmup, eta_min=min_lr)
    if warmup > 0:
        lin = LinearLR(opt, start_factor=1.0 / warmup, end_factor=1.0, total_iters=warmup - 1)
        sched = SequentialLR(opt, [lin, cos], milestones=[warmup])
    else:
        sched = cos
    out = []
    for _ in range(total):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out


@pytest.mark.parametrize(("total", "warmup", "min_lr"), [(20, 5, 0.0), (13, 0, 1e-4), (9, 2, 5e-4)])
def test_schedule_matches_torch_reference(total, warmup, min_lr):
    lr = 1e-2
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=lr)
    sched = build_scheduler(opt, total, warmup, min_lr / lr)
    ours = []
    for _ in range(total):
        ours.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    ref = _reference_lrs(lr, total, warmup, min_lr)
    assert ours == pytest.approx(ref, rel=1e-10, abs=1e-15)


def test_schedule_formula_points():
    # hand-computed values: warm-up 1/4, 2/4, ..., then cosine over 8 steps
    assert warmup_cosine_factor(0, 12, 4) == pytest.approx(0.25)
    assert warmup_cosine_factor(3, 12, 4) == pytest.approx(1.0)
    assert warmup_cosine_factor(4, 12, 4) == pytest.approx(1.0)
    assert warmup_cosine_factor(8, 12, 4) == pytest.approx(0.5)
    assert warmup_cosine_factor(10, 12, 4) == pytest.approx(0.5 * (1 + math.cos(math.pi * 0.75)))
    assert warmup_cosine_factor(12, 12, 4, min_factor=0.1) == pytest.approx(0.1)
    assert warmup_cosine_factor(50, 12, 4, min_factor=0.1) == pytest.approx(0.1)


def test_fit_uses_the_schedule_per_step():
    torch.manual_seed(0)
    m = LinearCE()
    # 64 samples / batch 8 = 8 batches; grad_accum 2 -> 4 steps per epoch, 3 epochs -> 12 steps
    res = fit(
        m,
        loader(),
        epochs=3,
        optimizer="adamw",
        lr=1e-2,
        min_lr=1e-3,
        warmup_epochs=1,
        grad_accum=2,
        progress=False,
    )
    assert res.global_step == 12
    assert res.lrs == pytest.approx(_reference_lrs(1e-2, 12, 4, 1e-3), rel=1e-10)


def test_unknown_optimizer_lists_valid_names():
    with pytest.raises(ValueError, match=r"unknown `optimizer` 'rmsprop'.*adamw.*lamb"):
        build_optimizer([torch.nn.Parameter(torch.zeros(1))], "rmsprop")
    with pytest.raises(ValueError, match="unknown `optimizer`"):
        fit(LinearCE(), loader(), optimizer="adam_typo", progress=False)


def test_optimizer_kinds():
    from timm.optim import Lamb

    p = [torch.nn.Parameter(torch.zeros(2))]
    assert isinstance(build_optimizer(p, "LAMB", lr=1e-3), Lamb)
    assert isinstance(build_optimizer(p, "adamw", lr=1e-3, weight_decay=0.05), torch.optim.AdamW)
    with pytest.raises(ValueError, match="`lr`"):
        build_optimizer(p, "adamw", lr=float("nan"))
    with pytest.raises(ValueError, match="total_steps"):
        warmup_cosine_factor(0, 0)


# -- step decay (MCI appendix B.3; used by bayesurl.experiments.controlled) ------------------
@settings(max_examples=40, deadline=None)
@given(
    total=st.integers(1, 60),
    milestones=st.lists(st.integers(0, 70), max_size=5).map(sorted),
    decay=st.sampled_from([0.1, 0.5, 0.9]),
)
def test_multistep_matches_torch_multisteplr(total, milestones, decay):
    # independent reference: torch's MultiStepLR stepped once per optimiser step
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=1.0)
    ref_sched = MultiStepLR(opt, milestones=milestones, gamma=decay)
    opt2 = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    ours = LambdaLR(opt2, MultiStep(milestones, decay))
    for step in range(total):
        want = opt.param_groups[0]["lr"]
        assert multistep_factor(step, milestones, decay) == pytest.approx(want, rel=1e-12)
        assert opt2.param_groups[0]["lr"] == pytest.approx(want, rel=1e-12)
        opt.step()
        ref_sched.step()
        opt2.step()
        ours.step()


@pytest.mark.parametrize("n_stages", [1, 2, 4, 7])
def test_even_milestones_are_the_stage_starts(n_stages):
    for total in range(1, 50):
        # brute force: step t is in stage min(n t // T, n - 1); a milestone starts each stage
        stage = [min(n_stages * t // total, n_stages - 1) for t in range(total)]
        starts = [
            next((t for t in range(total) if stage[t] >= k), total) for k in range(1, n_stages)
        ]
        assert even_milestones(total, n_stages) == starts
    assert even_milestones(8, 4) == [2, 4, 6]
    with pytest.raises(ValueError, match="n_stages"):
        even_milestones(8, 0)
    with pytest.raises(ValueError, match="decay"):
        multistep_factor(0, [1], 0.0)
