"""Checkpoints: weights_only loading, clear errors on bad files, bit-identical resume on CPU."""

from __future__ import annotations

import pytest
import torch
from _training_toys import LinearCE, NoisyMLP, loader

from bayesurl.methods import base
from bayesurl.training import fit, load_checkpoint, load_method_from_checkpoint, save_checkpoint


def _noisy_augment(x):
    return x + 0.05 * torch.randn_like(x)


def _run(tmp, epochs, resume=None, optimizer="lamb", init_seed=0, gen_seed=None, crash=None):
    torch.manual_seed(init_seed)
    m = NoisyMLP()
    m.crash_at_epoch = crash
    gen = torch.Generator().manual_seed(gen_seed) if gen_seed is not None else None
    kw = dict(
        epochs=epochs,
        optimizer=optimizer,
        lr=1e-2,
        weight_decay=0.01,
        warmup_epochs=1,
        grad_accum=2,
        seed=123,
        augment=_noisy_augment,
        checkpoint_dir=tmp,
        keep_epoch_checkpoints=True,
        resume=resume,
        progress=False,
        clip_grad=5.0,
    )
    if crash is not None:
        with pytest.raises(KeyboardInterrupt):
            fit(m, loader(shuffle=True, generator=gen), **kw)
        return m, None
    return m, fit(m, loader(shuffle=True, generator=gen), **kw)


def _opt_state(path):
    return torch.load(path, weights_only=True)["optimizer"]["state"]


def _assert_states_equal(a, b):
    assert a.keys() == b.keys()
    for k in a:
        for name in a[k]:
            va, vb = a[k][name], b[k][name]
            assert torch.equal(torch.as_tensor(va), torch.as_tensor(vb)), (k, name)


@pytest.mark.parametrize(("optimizer", "gen_seed"), [("lamb", None), ("adamw", 7)])
def test_resume_is_bit_identical(tmp_path, optimizer, gen_seed):
    """4 epochs straight == 2 epochs, the job dies, resume from last.pt, 2 more epochs."""
    straight, res_s = _run(tmp_path / "a", 4, optimizer=optimizer, gen_seed=gen_seed)
    _run(tmp_path / "b", 4, optimizer=optimizer, gen_seed=gen_seed, crash=2)
    assert torch.load(tmp_path / "b" / "last.pt", weights_only=True)["epoch"] == 2
    # a different init and a disturbed global RNG: everything must come from the checkpoint
    torch.manual_seed(999)
    torch.rand(17)
    resumed, res_r = _run(
        tmp_path / "b",
        4,
        resume=tmp_path / "b" / "last.pt",
        optimizer=optimizer,
        init_seed=5,
        gen_seed=gen_seed,
    )
    for (n, p), q in zip(straight.named_parameters(), resumed.parameters()):
        assert torch.equal(p, q), n
    _assert_states_equal(
        _opt_state(tmp_path / "a" / "last.pt"), _opt_state(tmp_path / "b" / "last.pt")
    )
    assert res_r.global_step == res_s.global_step == 4 * 4
    assert len(res_r.losses) == 2 * 4 and res_r.losses == res_s.losses[8:]
    assert [h["loss"] for h in res_r.history] == [h["loss"] for h in res_s.history]
    assert resumed.epochs_started == [2, 3]
    # resuming from the straight run's own epoch_2.pt gives the same parameters too
    again, _ = _run(
        tmp_path / "c",
        4,
        resume=tmp_path / "a" / "epoch_2.pt",
        optimizer=optimizer,
        init_seed=9,
        gen_seed=gen_seed,
    )
    assert all(torch.equal(p, q) for p, q in zip(straight.parameters(), again.parameters()))


def test_without_rng_restore_resume_would_differ(tmp_path):
    """Guards the test above: a run that only reloads weights/optimiser diverges."""
    straight, _ = _run(tmp_path / "a", 4)
    ckpt = torch.load(tmp_path / "a" / "epoch_2.pt", weights_only=True)
    ckpt["rng"][0]["torch"] = torch.manual_seed(4242).get_state()
    save_checkpoint(ckpt, tmp_path / "c.pt")
    resumed, _ = _run(tmp_path / "b", 4, resume=tmp_path / "c.pt")
    assert not all(torch.equal(p, q) for p, q in zip(straight.parameters(), resumed.parameters()))


def test_checkpoint_contents_load_weights_only(tmp_path):
    _, res = _run(tmp_path, 2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["epoch_1.pt", "epoch_2.pt", "last.pt"]
    ck = torch.load(tmp_path / "last.pt", weights_only=True)
    for key in (
        "model",
        "optimizer",
        "scheduler",
        "scaler",
        "epoch",
        "global_step",
        "rng",
        "loader",
        "method",
        "history",
        "config",
    ):
        assert key in ck
    assert ck["epoch"] == 2 and ck["global_step"] == 8 and res.checkpoint == tmp_path / "last.pt"
    assert set(ck["rng"][0]) >= {"torch", "numpy", "python", "cuda"}
    assert ck["method"]["name"] == "NoisyMLP" and ck["method"]["kwargs"] is None


def test_keep_epoch_checkpoints(tmp_path):
    torch.manual_seed(0)
    fit(
        LinearCE(),
        loader(),
        epochs=2,
        checkpoint_dir=tmp_path,
        keep_epoch_checkpoints=True,
        progress=False,
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["epoch_1.pt", "epoch_2.pt", "last.pt"]
    assert torch.load(tmp_path / "epoch_1.pt", weights_only=True)["epoch"] == 1


def test_corrupted_truncated_or_incomplete_checkpoints_fail_clearly(tmp_path):
    _run(tmp_path, 1)
    good = (tmp_path / "last.pt").read_bytes()
    (tmp_path / "trunc.pt").write_bytes(good[: len(good) // 2])
    (tmp_path / "garbage.pt").write_bytes(b"\x00not a checkpoint" * 50)
    for name, why in (("trunc.pt", "is corrupted or truncated"), ("garbage.pt", "is not a")):
        path = tmp_path / name
        with pytest.raises(ValueError, match=rf"checkpoint '.*{name}' {why}"):
            load_checkpoint(path)
        with pytest.raises(ValueError, match=name):
            _run(tmp_path / "x", 2, resume=path)
    ck = torch.load(tmp_path / "last.pt", weights_only=True)
    del ck["optimizer"], ck["rng"]
    torch.save(ck, tmp_path / "partial.pt")
    with pytest.raises(ValueError, match=r"partial.pt' is missing keys: optimizer, rng"):
        _run(tmp_path / "x", 2, resume=tmp_path / "partial.pt")
    torch.save({"weights": torch.zeros(2)}, tmp_path / "other.pt")
    with pytest.raises(ValueError, match="other.pt' is not a bayesurl training checkpoint"):
        load_checkpoint(tmp_path / "other.pt")
    with pytest.raises(FileNotFoundError, match="nope.pt"):
        load_checkpoint(tmp_path / "nope.pt")
    # a pickle with arbitrary objects is refused by weights_only
    torch.save({"format": "bayesurl-checkpoint", "obj": object}, tmp_path / "unsafe.pt")
    with pytest.raises(ValueError, match="unsafe.pt"):
        load_checkpoint(tmp_path / "unsafe.pt")


def test_resume_into_wrong_model_fails_clearly(tmp_path):
    _run(tmp_path, 1)
    with pytest.raises(ValueError, match="does not fit this run"):
        fit(LinearCE(), loader(), epochs=2, resume=tmp_path / "last.pt", progress=False)


def test_load_method_from_checkpoint(tmp_path, monkeypatch, request):
    monkeypatch.setattr(LinearCE, "name", "toy_linear_ce")
    base.METHODS.add("toy_linear_ce", LinearCE)
    request.addfinalizer(
        lambda: "toy_linear_ce" in base.METHODS and base.METHODS.remove("toy_linear_ce")
    )
    torch.manual_seed(0)
    m = LinearCE(in_dim=6, num_classes=3)
    fit(m, loader(), epochs=1, lr=1e-2, checkpoint_dir=tmp_path, progress=False)
    rebuilt = load_method_from_checkpoint(tmp_path / "last.pt")
    assert isinstance(rebuilt, LinearCE) and not rebuilt.training
    x = torch.randn(5, 6, dtype=torch.float64)
    assert torch.equal(rebuilt(x).embedding, m.eval()(x).embedding)

    base.METHODS.remove("toy_linear_ce")
    with pytest.raises(ValueError, match=r"last.pt'.*unknown method 'toy_linear_ce'"):
        load_method_from_checkpoint(tmp_path / "last.pt")


def test_unregistered_method_cannot_be_rebuilt(tmp_path):
    _run(tmp_path, 1)
    with pytest.raises(ValueError, match="constructor kwargs"):
        load_method_from_checkpoint(tmp_path / "last.pt")


def test_method_kwargs_must_be_plain(tmp_path):
    with pytest.raises(ValueError, match=r"`method_kwargs\['backbone'\]` is a Linear"):
        fit(
            LinearCE(),
            loader(),
            method_kwargs={"backbone": torch.nn.Linear(2, 2)},
            checkpoint_dir=tmp_path,
            progress=False,
        )


def test_method_kwargs_default_to_the_methods_record(tmp_path):
    torch.manual_seed(0)
    m = LinearCE(in_dim=6, num_classes=3)
    m.hparams = {"in_dim": 6, "num_classes": 3, "dtype": "float64"}
    fit(m, loader(), checkpoint_dir=tmp_path / "a", progress=False)
    ck = torch.load(tmp_path / "a" / "last.pt", weights_only=True)
    assert ck["method"]["kwargs"] == m.hparams

    m.hparams = {"backbone": torch.nn.Linear(2, 2)}  # a module cannot be stored: warn, keep None
    with pytest.warns(UserWarning, match="cannot rebuild the method by name"):
        fit(m, loader(), checkpoint_dir=tmp_path / "b", progress=False)
    assert torch.load(tmp_path / "b" / "last.pt", weights_only=True)["method"]["kwargs"] is None
