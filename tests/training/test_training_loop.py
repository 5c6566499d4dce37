"""The training loop on toy methods: loss decreases, accumulation is exact, bad input fails."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from _training_toys import LinearCE, NaNAfter, NoisyMLP, TwoViewToy, blobs, loader

from bayesurl.training import fit, prepare_batch


def test_loss_goes_down():
    torch.manual_seed(0)
    m = NoisyMLP()
    x, y = blobs(64)
    with torch.no_grad():
        before = F.cross_entropy(m.eval()(x).logits, y).item()
    res = fit(
        m,
        loader(shuffle=True),
        epochs=6,
        optimizer="lamb",
        lr=2e-2,
        warmup_epochs=1,
        seed=0,
        progress=False,
    )
    with torch.no_grad():
        after = F.cross_entropy(m.eval()(x).logits, y).item()
    assert after < 0.5 * before
    assert res.history[-1]["loss"] < res.history[0]["loss"]
    assert m.epochs_started == list(range(6)) and m.epochs_ended == list(range(6))
    assert res.epochs == 6 and len(res.losses) == res.global_step == 6 * 8


@pytest.mark.parametrize(("n", "micro", "accum"), [(32, 8, 4), (40, 8, 2)])
def test_grad_accumulation_equals_big_batch(n, micro, accum):
    """k micro-batches accumulated == one batch k times larger (incl. a short last group).

    Reference: a hand-written SGD loop on the big batches with autograd, float64.
    """
    torch.manual_seed(1)
    m = LinearCE()
    w0 = {k: v.clone() for k, v in m.state_dict().items()}
    lr = 0.3
    fit(
        m,
        loader(n, micro),
        epochs=2,
        optimizer="sgd",
        lr=lr,
        min_lr=lr,
        grad_accum=accum,
        progress=False,
    )

    x, y = blobs(n)
    big = micro * accum
    w, b = w0["linear.weight"].clone(), w0["linear.bias"].clone()
    for _ in range(2):
        for s in range(0, n, big):
            wr, br = w.clone().requires_grad_(), b.clone().requires_grad_()
            loss = F.cross_entropy(x[s : s + big] @ wr.T + br, y[s : s + big])
            gw, gb = torch.autograd.grad(loss, (wr, br))
            w, b = w - lr * gw, b - lr * gb
    torch.testing.assert_close(m.linear.weight.detach(), w, rtol=0, atol=1e-12)
    torch.testing.assert_close(m.linear.bias.detach(), b, rtol=0, atol=1e-12)


def test_two_view_method_gets_two_augmented_views():
    torch.manual_seed(0)
    calls = []

    def augment(x):
        calls.append(x.shape)
        return x + 0.1 * torch.randn_like(x)

    m = TwoViewToy()
    res = fit(m, loader(), epochs=3, optimizer="adamw", lr=5e-2, augment=augment, progress=False)
    assert m.seen_pairs == 3 * 8 and len(calls) == 2 * 3 * 8
    assert res.history[-1]["loss"] < res.history[0]["loss"]

    with pytest.raises(ValueError, match="two views"):
        fit(TwoViewToy(), loader(), progress=False)

    # a loader that already yields (x1, x2) needs no augment
    x = torch.randn(4, 6, dtype=torch.float64)
    (v1, v2), _ = prepare_batch(((x, x + 1), torch.zeros(4)), m, torch.device("cpu"))
    assert torch.equal(v1, x) and torch.equal(v2, x + 1)
    # two independent draws of the augmentation
    (a1, a2), _ = prepare_batch((x, torch.zeros(4)), m, torch.device("cpu"), augment)
    assert not torch.equal(a1, a2)


def test_nan_loss_fails_naming_the_step():
    with pytest.raises(FloatingPointError, match=r"epoch 1, batch 3, optimiser step 2"):
        fit(NaNAfter(bad_step=3), loader(), grad_accum=2, progress=False)


def test_bad_arguments():
    m = LinearCE()
    with pytest.raises(ValueError, match="`epochs`"):
        fit(m, loader(), epochs=0, progress=False)
    with pytest.raises(ValueError, match="`grad_accum`"):
        fit(m, loader(), grad_accum=0, progress=False)
    with pytest.raises(ValueError, match=r"unknown `amp` mode 'fp8'.*bf16"):
        fit(m, loader(), amp="fp8", progress=False)
    with pytest.raises(ValueError, match="needs a CUDA device"):
        fit(m, loader(), amp="fp16", device="cpu", progress=False)
    with pytest.raises(ValueError, match="no batches"):
        fit(m, loader(n=0), progress=False)
    with pytest.raises(ValueError, match=r"`batch` must be a pair"):
        fit(m, [torch.zeros(2, 6)], progress=False)
    with pytest.raises(ValueError, match="`min_lr`"):
        fit(m, loader(), lr=1e-3, min_lr=1e-2, progress=False)
    with pytest.raises(TypeError, match="`method`"):
        fit(torch.nn.Linear(2, 2), loader(), progress=False)


def test_eval_fn_progress_and_plot(tmp_path, capsys):
    torch.manual_seed(0)
    m = LinearCE()
    seen = []

    def eval_fn(method, epoch):
        assert not method.training
        seen.append(epoch)
        return {"acc": (method(blobs(64)[0]).logits.argmax(1) == blobs(64)[1]).double().mean()}

    res = fit(m, loader(), epochs=2, lr=1e-2, eval_fn=eval_fn, progress=True)
    assert seen == [0, 1]
    assert isinstance(res.history[1]["eval"]["acc"], float)
    assert "epoch 2/2" in capsys.readouterr().err
    res.plot(tmp_path / "loss.png")
    assert (tmp_path / "loss.png").stat().st_size > 1000


def test_bf16_autocast_on_cpu_runs():
    torch.manual_seed(0)
    m = LinearCE(dtype="float32")
    x, y = blobs(64)
    ds = torch.utils.data.TensorDataset(x.float(), y)
    res = fit(
        m,
        torch.utils.data.DataLoader(ds, batch_size=16),
        epochs=2,
        lr=1e-2,
        amp="bf16",
        progress=False,
    )
    assert all(torch.isfinite(p).all() for p in m.parameters())
    assert len(res.losses) == 8


@pytest.mark.skipif(not torch.cuda.is_available(), reason="mixed precision runs on CUDA only")
@pytest.mark.parametrize("amp", ["fp16", "bf16", "auto"])
def test_amp_on_cuda_trains_and_checkpoints_the_scaler(tmp_path, amp):
    torch.manual_seed(0)
    m = LinearCE(dtype="float32").cuda()
    x, y = blobs(64)
    ds = torch.utils.data.TensorDataset(x.float(), y)
    ld = torch.utils.data.DataLoader(ds, batch_size=16)
    res = fit(
        m,
        ld,
        epochs=4,
        lr=5e-2,
        amp=amp,
        checkpoint_dir=tmp_path,
        keep_epoch_checkpoints=True,
        progress=False,
    )
    assert next(m.parameters()).device.type == "cuda"
    assert res.history[-1]["loss"] < res.history[0]["loss"]
    ck = torch.load(tmp_path / "last.pt", weights_only=True)
    uses_fp16 = amp == "fp16" or (amp == "auto" and not torch.cuda.is_bf16_supported())
    assert bool(ck["scaler"]) == uses_fp16
    again = fit(m, ld, epochs=4, lr=5e-2, amp=amp, resume=tmp_path / "epoch_2.pt", progress=False)
    assert again.epochs == 4
