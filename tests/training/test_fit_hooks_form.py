"""fit's behaviours as hooks: the old keywords (checkpoint_dir, keep_epoch_checkpoints,
eval_fn) warn, name their replacement and give the run the new form gives, bit for bit."""

from __future__ import annotations

import warnings

import pytest
import torch
from _training_toys import NoisyMLP, loader

from bayesurl.training import Checkpointing, EpochEvaluation, fit, load_checkpoint


def _probe(method, epoch):
    return {"w0": float(next(method.parameters()).detach().sum()), "epoch": epoch}


def _run(tmp_path, name, **kw):
    torch.manual_seed(0)
    method = NoisyMLP()
    result = fit(method, loader(n=40, batch_size=8), epochs=2, optimizer="adamw", lr=0.05,
                 seed=3, progress=False, **kw)  # fmt: skip
    return method, result, load_checkpoint(tmp_path / name / "last.pt")


def test_old_keywords_warn_and_match_the_hooks(tmp_path) -> None:
    with pytest.warns(DeprecationWarning) as caught:
        old_m, old, old_ck = _run(
            tmp_path, "old", checkpoint_dir=tmp_path / "old", keep_epoch_checkpoints=True,
            eval_fn=_probe,
        )  # fmt: skip
    messages = sorted(str(w.message) for w in caught if w.category is DeprecationWarning)
    assert len(messages) == 3
    assert "`checkpoint_dir` is deprecated; use hooks=[..., Checkpointing(" in messages[0]
    assert "`eval_fn` is deprecated; use hooks=[EpochEvaluation(eval_fn)" in messages[1]
    assert "keep_epochs=True" in messages[2]
    assert all(w.filename == __file__ for w in caught)  # points at the caller
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        hooks = [EpochEvaluation(_probe), Checkpointing(tmp_path / "new", keep_epochs=True)]
        new_m, new, new_ck = _run(tmp_path, "new", hooks=hooks)

    def timeless(history):
        return [{k: v for k, v in h.items() if k != "time"} for h in history]

    assert old.losses == new.losses and timeless(old.history) == timeless(new.history)
    assert [h["eval"] for h in new.history] == [h["eval"] for h in old.history]
    for a, b in zip(old_m.parameters(), new_m.parameters(), strict=True):
        assert torch.equal(a, b)
    assert old_ck["method"] == new_ck["method"] and old_ck["config"] == new_ck["config"]
    # the evaluation is part of the checkpoint
    assert timeless(old_ck["history"]) == timeless(new_ck["history"])
    for name in ("old", "new"):
        assert sorted(p.name for p in (tmp_path / name).iterdir()) == [
            "epoch_1.pt", "epoch_2.pt", "last.pt",
        ]  # fmt: skip


def test_an_unknown_keyword_is_still_a_type_error() -> None:
    with pytest.raises(TypeError, match="unexpected keyword argument 'checkpoint_directory'"):
        fit(NoisyMLP(), loader(n=8, batch_size=8), checkpoint_directory="x")


def test_checkpointing_checks_its_directory_when_made(tmp_path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ValueError, match="directory"):
        Checkpointing(blocker / "sub")
    with pytest.warns(DeprecationWarning), pytest.raises(ValueError, match="checkpoint_dir"):
        fit(NoisyMLP(), loader(n=8, batch_size=8), checkpoint_dir=blocker / "sub")
