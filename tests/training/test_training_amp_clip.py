"""Gradient clipping against a hand-written clipped SGD step, and the fp16 GradScaler's
checkpoint round trip on CPU (the CUDA test of the same path is skipped without a GPU)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from _training_toys import LinearCE, blobs
from torch.utils.data import DataLoader, TensorDataset

import bayesurl.training.loop as loop
from bayesurl.training import fit, load_checkpoint

# overflowing fp16 steps are skipped by the scaler, so the scheduler steps without them
pytestmark = pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step\\(\\)`")


@pytest.mark.parametrize("clip", [0.05, 1e6])
def test_clip_grad_matches_manual_clipped_sgd_step(clip):
    torch.manual_seed(0)
    m = LinearCE()
    ref = copy.deepcopy(m)
    x, y = blobs(16)
    res = fit(
        m,
        DataLoader(TensorDataset(x, y), batch_size=16),
        optimizer="sgd",
        lr=0.5,
        clip_grad=clip,
        progress=False,
    )
    assert res.global_step == 1 and res.lrs == [0.5]
    loss = F.cross_entropy(ref.linear(x), y)
    grads = torch.autograd.grad(loss, list(ref.parameters()))
    norm = torch.sqrt(sum((g**2).sum() for g in grads))
    scale = min(1.0, clip / float(norm))
    assert (scale < 1.0) == (clip < 1.0)  # the small bound really clips (||g|| ~ 1)
    for p, p0, g in zip(m.parameters(), ref.parameters(), grads):
        torch.testing.assert_close(p.detach(), p0.detach() - 0.5 * scale * g, rtol=1e-6, atol=1e-7)


def _forced_fp16(monkeypatch):
    """fp16 autocast + an enabled GradScaler on CPU: the loop refuses amp='fp16' off CUDA, so
    the mode resolution is forced; everything after it (scaling, unscale for clipping, skipped
    overflow steps, the scaler's state in the checkpoint, resume) is the CUDA code path."""
    monkeypatch.setattr(loop, "_resolve_amp", lambda amp, device: torch.float16)


def _run(tmp, epochs, resume=None, keep=False):
    torch.manual_seed(0)
    m = LinearCE(dtype="float32")
    x, y = blobs(64)
    ld = DataLoader(TensorDataset(x.float(), y), batch_size=16)
    res = fit(
        m,
        ld,
        epochs=epochs,
        optimizer="adamw",
        lr=5e-2,
        min_lr=5e-2,
        clip_grad=1.0,
        amp="fp16",
        seed=0,
        checkpoint_dir=tmp,
        keep_epoch_checkpoints=keep,
        resume=resume,
        progress=False,
    )
    return m, res


def test_fp16_grad_scaler_state_checkpoints_and_resumes_on_cpu(tmp_path, monkeypatch):
    _forced_fp16(monkeypatch)
    straight, res = _run(tmp_path / "a", 4, keep=True)
    assert res.history[-1]["loss"] < res.history[0]["loss"]
    ck = load_checkpoint(tmp_path / "a" / "last.pt")
    assert ck["scaler"], "an enabled scaler must be saved"
    # fp16 overflows at the initial scale 2^16 here: the scaler backed off (its state matters)
    assert 0 < float(ck["scaler"]["scale"]) < 2.0**16
    half = load_checkpoint(tmp_path / "a" / "epoch_2.pt")
    assert float(half["scaler"]["scale"]) < 2.0**16
    # resume the same 4-epoch plan from its epoch-2 checkpoint (a resume must keep
    # the saved plan, so the run is not "2 epochs, then extended to 4")
    resumed, again = _run(tmp_path / "b", 4, resume=tmp_path / "a" / "epoch_2.pt")
    assert again.epochs == 4
    for a, b in zip(straight.state_dict().values(), resumed.state_dict().values()):
        assert torch.equal(a, b)  # bit-identical: the scaler's scale and tracker were restored
    final = load_checkpoint(tmp_path / "b" / "last.pt")
    assert final["scaler"]["scale"] == ck["scaler"]["scale"]
