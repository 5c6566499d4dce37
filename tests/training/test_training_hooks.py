"""Training hooks: the events' order, keyed state through checkpoints, and the EMA hook
against a moving average computed by hand from the recorded weights."""

from __future__ import annotations

import pytest
import torch
from _training_toys import LinearCE, loader

from bayesurl.training import ExponentialMovingAverage, Hook, fit


class Recorder(Hook):
    """Writes every event down; keeps the number of steps as its checkpointed state."""

    key = "recorder"

    def __init__(self) -> None:
        self.events: list[str] = []
        self.steps = 0

    def on_fit_start(self, trainer):
        self.events.append("fit_start")

    def on_epoch_start(self, trainer, epoch):
        self.events.append(f"epoch_start {epoch}")

    def on_backward_end(self, trainer, loss):
        assert isinstance(loss, float)
        self.events.append("backward")

    def on_step_end(self, trainer):
        self.steps += 1
        self.events.append("step")

    def on_epoch_end(self, trainer, record):
        assert trainer.result.history[-1] is record  # recorded before the hooks run
        self.events.append(f"epoch_end {record['epoch']}")

    def on_fit_end(self, trainer):
        self.events.append("fit_end")

    def state_dict(self):
        return {"steps": self.steps}

    def load_state_dict(self, state):
        self.steps = int(state["steps"])


def test_events_follow_micro_batches_and_accumulation_groups():
    rec = Recorder()
    fit(LinearCE(), loader(n=24, batch_size=8), epochs=1, grad_accum=2, progress=False,
        optimizer="sgd", lr=0.1, hooks=[rec])  # fmt: skip
    # 3 micro-batches in groups of 2 and 1: a step after the 2nd and after the 3rd
    assert rec.events == [
        "fit_start", "epoch_start 0", "backward", "backward", "step", "backward", "step",
        "epoch_end 1", "fit_end",
    ]  # fmt: skip


def test_keyed_hook_state_is_checkpointed_and_restored(tmp_path):
    kw = dict(epochs=2, optimizer="sgd", lr=0.1, progress=False)
    fit(LinearCE(), loader(n=32), checkpoint_dir=tmp_path, keep_epoch_checkpoints=True,
        hooks=[Recorder()], **kw)  # fmt: skip
    ck = torch.load(tmp_path / "epoch_1.pt", weights_only=True)
    assert ck["hooks"] == {"recorder": {"steps": 4}}
    rec = Recorder()
    fit(LinearCE(), loader(n=32), resume=tmp_path / "epoch_1.pt", hooks=[rec], **kw)
    assert rec.steps == 8  # 4 restored + 4 of the second epoch
    with pytest.raises(ValueError, match="hook .other."):  # not in that checkpoint
        fit(LinearCE(), loader(n=32), resume=tmp_path / "epoch_1.pt",
            hooks=[Recorder(), _Other()], **kw)  # fmt: skip


class _Other(Hook):
    key = "other"


class _Weights(Hook):
    def __init__(self) -> None:
        self.seen: list[dict[str, torch.Tensor]] = []

    def on_step_end(self, trainer):
        self.seen.append({k: v.detach().clone() for k, v in trainer.method.named_parameters()})


def test_ema_hook_equals_the_moving_average_of_the_recorded_weights(tmp_path):
    weights, ema = _Weights(), ExponentialMovingAverage(decay=0.75)
    method = LinearCE()
    fit(method, loader(n=32), epochs=2, optimizer="sgd", lr=0.2, progress=False,
        hooks=[weights, ema])  # fmt: skip
    assert len(weights.seen) == 8
    for name in weights.seen[0]:
        avg = weights.seen[0][name].numpy().copy()
        for w in weights.seen[1:]:
            avg = 0.75 * avg + 0.25 * w[name].numpy()
        torch.testing.assert_close(ema.average[name], torch.from_numpy(avg), rtol=1e-12, atol=0)
    other = LinearCE()
    ema.copy_to(other)
    copied = dict(other.named_parameters())["linear.weight"]
    assert torch.equal(copied, ema.average["linear.weight"])
    with pytest.raises(ValueError, match="decay"):
        ExponentialMovingAverage(decay=1.0)
