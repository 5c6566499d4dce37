"""One storage interface (:class:`bayesurl.sweeps.storage.RunStore`): the memory store and
the Optuna RDB storage both implement it, method by method, and a throwaway store written
against the interface alone drives a sweep to the same records as the memory store."""

from __future__ import annotations

import inspect
import json
import math
from typing import Any

import pytest

pytest.importorskip("optuna")

from bayesurl.sweeps import sweep  # noqa: E402
from bayesurl.sweeps.plan import SweepPreset  # noqa: E402
from bayesurl.sweeps.storage import (  # noqa: E402
    Claim,
    MemoryStore,
    RunStore,
    SweepStorage,
)

#: the methods a store must offer, read from the protocol itself
METHODS = sorted(n for n, v in vars(RunStore).items() if callable(v) and not n.startswith("_"))


def _accepts(impl: Any, proto: Any) -> list[str]:
    """What ``impl`` lacks of the call shape of ``proto``: each of the protocol's parameters
    by name and kind, and a default for every parameter of its own."""
    have = inspect.signature(impl).parameters
    want = inspect.signature(proto).parameters
    missing = [
        f"{n} ({p.kind.name})"
        for n, p in want.items()
        if n != "self" and (n not in have or have[n].kind != p.kind)
    ]
    extra = [
        f"{n} needs a default"
        for n, p in have.items()
        if n not in want
        and p.default is p.empty
        and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)
    ]
    return missing + extra


def test_the_protocol_names_what_the_engine_calls():
    assert METHODS == [
        "add_runs",
        "failures",
        "other_sweeps",
        "records",
        "status",
        "tuning_study",
        "work",
    ]


@pytest.mark.parametrize("make", ["memory", "sqlite"])
def test_both_stores_implement_the_protocol(make, tmp_path):
    store = MemoryStore() if make == "memory" else SweepStorage(out=tmp_path, sweep="t")
    assert isinstance(store, RunStore)
    assert isinstance(store.url, str) and store.url
    for name in METHODS:
        gaps = _accepts(getattr(type(store), name), getattr(RunStore, name))
        assert not gaps, f"{type(store).__name__}.{name}: {gaps}"
    # the same answers on the same small plan
    plan = [{"estimator": "ce", "split": 0, "seed": s} for s in (0, 1)]
    assert store.add_runs(plan) == 2
    assert store.status() == {"waiting": 2, "running": 0, "complete": 0, "failed": 0, "total": 2}
    seen: list[Claim] = []
    n = store.work(lambda p: {"r_auroc": 0.5 + p["seed"]}, on_done=lambda c, r, e: seen.append(c))
    assert n == 2 and [c.params["seed"] for c in seen] == [0, 1]
    assert all(isinstance(c, Claim) for c in seen)
    assert [r["r_auroc"] for r in store.records()] == [0.5, 1.5]
    assert store.status()["complete"] == 2 and store.failures() == []
    assert store.other_sweeps() == []
    assert store.tuning_study("ce").direction.name == "MAXIMIZE"


class ListStore:
    """A store written against :class:`RunStore` alone: a plan, records in a dict, runs
    taken last first (the engine must not rely on the order the store runs them in)."""

    url = "list"

    def __init__(self) -> None:
        self.plan: list[dict[str, Any]] = []
        self.done: dict[int, dict[str, Any]] = {}

    def add_runs(self, runs):
        self.plan += [dict(r) for r in runs]
        return len(runs)

    def work(self, fn, *, wait=True, poll=5.0, on_done=None):
        todo = [i for i in range(len(self.plan)) if i not in self.done][::-1]
        for i in todo:
            self.done[i] = dict(fn(dict(self.plan[i])))
            if on_done is not None:
                on_done(Claim(str(i), self.plan[i], i, 1), self.done[i], None)
        return len(todo)

    def status(self):
        n, k = len(self.plan), len(self.done)
        return {"waiting": n - k, "running": 0, "complete": k, "failed": 0, "total": n}

    def records(self):
        return [self.done[i] for i in sorted(self.done)]

    def failures(self):
        return []

    def other_sweeps(self):
        return []

    def tuning_study(self, name, *, sampler=None):
        raise AssertionError("no tuning in this sweep")


def _fake_run(params):
    k, s = params["split"], params["seed"]
    return {
        "r@1": 0.6 + 0.01 * k,
        "r_auroc": 0.55 + 0.01 * k + 0.003 * math.sin(7 * k + 3 * s + len(params["estimator"])),
        "total_time": 0.01,
    }


def test_a_store_of_the_protocol_drives_a_sweep(monkeypatch):
    preset = SweepPreset("t", splits=2, seeds=(0, 1))
    kw = dict(preset=preset, run_fn=_fake_run, log=lambda s: None)
    ref = sweep.run_sweep(["ce", "a"], **kw)
    mine = ListStore()
    assert isinstance(mine, RunStore)
    monkeypatch.setattr(sweep._Sweep, "open_store", lambda self: mine)
    got = sweep.run_sweep(["ce", "a"], **kw)
    assert len(mine.done) == 8 and got.status == ref.status
    assert got.runs == ref.runs
    assert got.summary() == ref.summary()


def test_a_stored_sweep_reads_every_record_for_partial_runs_not_after_each_run(
    monkeypatch, tmp_path
):
    """``partial_runs.json`` holds every finished record, and writing it reads them all from
    the storage: a stored sweep writes it after its first run, then at most every
    ``PARTIAL_EVERY_S`` seconds, and after its last run, so a fast sweep of 8 runs reads the
    records three times (the two writes and the report), not once per run, and the file still
    ends with all 8."""

    class Counting(ListStore):
        reads = 0

        def records(self):
            Counting.reads += 1
            return super().records()

    mine = Counting()
    monkeypatch.setattr(sweep._Sweep, "open_store", lambda self: mine)
    preset = SweepPreset("t", splits=2, seeds=(0, 1), storage="stored")
    sweep.run_sweep(["ce", "a"], preset=preset, run_fn=_fake_run, log=lambda s: None, out=tmp_path)
    partial = json.loads((tmp_path / "partial_runs.json").read_text())
    assert len(partial["runs"]) == 8 and partial["status"]["complete"] == 8
    assert Counting.reads == 3
    monkeypatch.setattr(sweep, "PARTIAL_EVERY_S", 0.0)
    Counting.reads, mine = 0, Counting()
    sweep.run_sweep(["ce", "a"], preset=preset, run_fn=_fake_run, log=lambda s: None, out=tmp_path)
    assert Counting.reads == 9  # without the pause: after every run
