"""Sweep storage: claim-a-run semantics on a shared Optuna RDB (SQLite) storage.

The reference is an execution log written by the fake run function itself (one line per
execution, appended by each worker process): every planned run must appear in it exactly once
and have exactly one stored record.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("optuna")

from bayesurl.sweeps.storage import SweepStorage, default_storage_url, run_key  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]

WORKER = textwrap.dedent(
    """
    import os, sys, time
    from bayesurl.sweeps.storage import SweepStorage

    url, log, n_est, n_split, n_seed, sleep = sys.argv[1:7]
    plan = [
        {"estimator": f"m{e}", "split": k, "seed": s}
        for e in range(int(n_est)) for k in range(int(n_split)) for s in range(int(n_seed))
    ]
    store = SweepStorage(url, sweep="test", heartbeat_interval=1, grace_period=3)
    store.add_runs(plan)

    def fn(params):
        key = f"{params['estimator']}/split{params['split']}/seed{params['seed']}"
        with open(log, "a") as fh:          # one O_APPEND write per started run
            fh.write(f"start {key} {os.getpid()}\\n")
        time.sleep(float(sleep))
        with open(log, "a") as fh:
            fh.write(f"end {key} {os.getpid()}\\n")
        return {"value": params["split"] * 10 + params["seed"], "pid": os.getpid()}

    n = store.work(fn, poll=0.2)
    print("DONE", n, flush=True)
    """
)


def _spawn(tmp_path: Path, url: str, log: Path, sizes: tuple[int, int, int], sleep: float):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    args = [sys.executable, str(script), url, str(log), *map(str, sizes), str(sleep)]
    return subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _log(log: Path) -> tuple[Counter, Counter, set[str]]:
    starts, ends, pids = Counter(), Counter(), set()
    for line in log.read_text().splitlines():
        what, key, pid = line.split()
        (starts if what == "start" else ends)[key] += 1
        pids.add(pid)
    return starts, ends, pids


@pytest.mark.parametrize(
    "backend", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]
)
def test_two_worker_processes_share_one_storage(tmp_path, backend, request):
    if backend == "sqlite":
        url = default_storage_url(tmp_path / "out")
    else:
        url = request.getfixturevalue("postgres").new_database()
    log = tmp_path / "log.txt"
    sizes = (3, 2, 3)  # 18 runs
    procs = [_spawn(tmp_path, url, log, sizes, 0.05) for _ in range(2)]
    outs = [p.communicate(timeout=240) for p in procs]
    for p, (_out, err) in zip(procs, outs):
        assert p.returncode == 0, err.decode()[-3000:]
    done = [int(o.decode().split()[-1]) for o, _ in outs]
    planned = {run_key(f"m{e}", k, s) for e in range(3) for k in range(2) for s in range(3)}
    starts, ends, pids = _log(log)
    assert set(starts) == planned  # none lost
    assert max(starts.values()) == 1  # none done twice
    assert starts == ends
    assert sum(done) == len(planned)
    assert len(pids) == 2 and min(done) >= 1  # both workers did work
    store = SweepStorage(url, sweep="test")
    recs = store.records()
    assert sorted(r["key"] for r in recs) == sorted(planned)
    for r in recs:
        _, split, seed = r["key"].split("/")
        assert r["value"] == int(split[5:]) * 10 + int(seed[4:])
    assert store.status() == {
        "waiting": 0,
        "running": 0,
        "complete": len(planned),
        "failed": 0,
        "total": len(planned),
    }


def test_killed_sweep_restarts_without_repeating_finished_runs(tmp_path):
    url = default_storage_url(tmp_path)
    log = tmp_path / "log.txt"
    sizes = (1, 2, 3)  # 6 runs of 0.6 s
    p = _spawn(tmp_path, url, log, sizes, 0.6)
    deadline = time.time() + 120
    while time.time() < deadline:  # kill it hard in the middle of a run
        if log.exists():
            starts, ends, _ = _log(log)
            if len(ends) >= 2 and len(starts) > len(ends):
                break
        time.sleep(0.05)
    p.send_signal(signal.SIGKILL)
    p.wait(timeout=30)
    finished_before = set(_log(log)[1])
    assert 2 <= len(finished_before) < 6
    q = _spawn(tmp_path, url, log, sizes, 0.05)  # the restarted sweep
    out, err = q.communicate(timeout=240)
    assert q.returncode == 0, err.decode()[-3000:]
    starts, ends, _ = _log(log)
    planned = {run_key("m0", k, s) for k in range(2) for s in range(3)}
    assert set(ends) == planned and max(ends.values()) == 1
    for key in finished_before:
        assert starts[key] == 1  # finished runs were not repeated
    # the run killed mid-way was started twice and finished once
    assert sum(starts.values()) == len(planned) + 1
    assert len(SweepStorage(url, sweep="test").records()) == len(planned)


def test_errors_are_recorded_and_retried_up_to_max_attempts(tmp_path):
    store = SweepStorage(out=tmp_path, sweep="err", max_attempts=2, heartbeat_interval=1)
    plan = [{"estimator": "ok", "split": 0, "seed": 0}, {"estimator": "bad", "split": 0, "seed": 0}]
    assert store.add_runs(plan) == 2
    assert store.add_runs(plan) == 0  # idempotent
    calls: Counter = Counter()

    def fn(params):
        calls[params["estimator"]] += 1
        if params["estimator"] == "bad":
            raise RuntimeError("boom")
        return {"r_auroc": 0.7}

    store.work(fn, wait=False)
    assert calls == {"ok": 1, "bad": 2}
    assert [r["key"] for r in store.records()] == ["ok/split0/seed0"]
    fails = store.failures()
    assert len(fails) == 2 and all("RuntimeError: boom" in f["error"] for f in fails)
    assert store.status()["failed"] == 1
    assert store.add_runs(plan) == 0
    assert store.add_runs(plan, retry_failed=True) == 1


def test_duplicate_enqueue_runs_once(tmp_path):
    """Two workers racing on the enqueue: the second copy of a key is never executed."""
    import optuna

    store = SweepStorage(out=tmp_path, sweep="dup")
    store.add_runs([{"estimator": "a", "split": 0, "seed": 0}])
    dup = optuna.trial.create_trial(
        state=optuna.trial.TrialState.WAITING,
        user_attrs={"key": "a/split0/seed0", "params": {"estimator": "a", "split": 0, "seed": 0}},
    )
    store.storage.create_new_trial(store._study_id, dup)
    calls: list = []
    store.work(lambda p: calls.append(p) or {}, wait=False)
    assert len(calls) == 1
    assert store.status()["complete"] == 1


def test_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="url"):
        SweepStorage()
    with pytest.raises(ValueError, match="max_attempts"):
        SweepStorage(out=tmp_path, max_attempts=0)
    store = SweepStorage(out=tmp_path)
    with pytest.raises(ValueError, match="lacks"):
        store.add_runs([{"estimator": "a", "split": 0}])
    with pytest.raises(ValueError, match="twice"):
        store.add_runs([{"estimator": "a", "split": 0, "seed": 1}] * 2)
    with pytest.raises(ValueError, match="estimator"):
        run_key("a/b", 0, 0)
    with pytest.raises(ValueError, match="seed"):
        run_key("a", 0, -1)


def test_a_run_failed_as_stale_is_not_overwritten_by_its_late_worker(tmp_path):
    """A worker that lost its run (no heartbeat, failed as stale) finishes quietly; the run is
    redone once by the next claim, and exactly one record is kept."""
    store = SweepStorage(out=tmp_path, sweep="late", heartbeat_interval=1, grace_period=1)
    store.add_runs([{"estimator": "a", "split": 0, "seed": 0}])
    claim = store.claim()
    store._finish(claim.trial_id, __import__("optuna").trial.TrialState.FAIL)  # as fail_stale
    store.complete(claim, {"r_auroc": 0.6})  # the late worker: no error, nothing stored
    assert store.records() == []
    calls = []
    store.work(lambda p: calls.append(p) or {"r_auroc": 0.7}, wait=False)
    assert len(calls) == 1 and [r["r_auroc"] for r in store.records()] == [0.7]


def _finished_store(tmp_path, n=3):
    store = SweepStorage(out=tmp_path, sweep="test")
    store.add_runs([{"estimator": "ce", "split": 0, "seed": s} for s in range(n)])
    store.work(lambda p: {"r@1": 0.5 + p["seed"] / 10})
    return store


def test_corrupted_storage_is_one_line_and_left_untouched(tmp_path):
    from bayesurl.sweeps.storage import StorageError

    _finished_store(tmp_path)
    db = tmp_path / "sweep.db"
    # fold the write-ahead log in, then damage the file as a failing disk or a cut copy would
    SweepStorage(out=tmp_path, sweep="test").storage.engine.dispose()
    import sqlite3

    with sqlite3.connect(db) as con:
        con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    raw = db.read_bytes()
    db.write_bytes(raw[: len(raw) // 2])
    damaged = db.read_bytes()
    with pytest.raises(
        StorageError, match=r"^sweep storage sqlite:///.*sweep.db is unreadable"
    ) as e:
        SweepStorage(out=tmp_path, sweep="test").records()
    assert "\n" not in str(e.value) and "left untouched" in str(e.value)
    assert db.read_bytes() == damaged  # nothing rewritten or recreated
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "sweep.db").write_bytes(b"not a database" * 64)
    with pytest.raises(StorageError, match="file is not a database"):
        SweepStorage(out=tmp_path / "other", sweep="test")
    # the undamaged bytes still hold every finished run
    db.write_bytes(raw)
    assert [r["r@1"] for r in SweepStorage(out=tmp_path, sweep="test").records()] == [
        0.5,
        0.6,
        0.7,
    ]


_LOCKER = textwrap.dedent(
    """
    import sqlite3, sys, time
    con = sqlite3.connect(sys.argv[1], isolation_level=None)
    con.execute("BEGIN IMMEDIATE")  # a hung process holding the write lock
    print("locked", flush=True)
    time.sleep(600)
    """
)


def test_locked_storage_gives_one_line_and_loses_no_finished_run(tmp_path):
    from bayesurl.sweeps.storage import StorageError

    _finished_store(tmp_path)
    locker = subprocess.Popen(
        [sys.executable, "-c", _LOCKER, str(tmp_path / "sweep.db")], stdout=subprocess.PIPE
    )
    try:
        assert locker.stdout.readline().strip() == b"locked"
        t0 = time.monotonic()
        with pytest.raises(StorageError, match="stayed locked by another process") as e:
            store = SweepStorage(out=tmp_path, sweep="test", lock_timeout=2)
            store.add_runs([{"estimator": "ce", "split": 0, "seed": 9}])
        assert time.monotonic() - t0 < 60 and "\n" not in str(e.value)
    finally:
        locker.send_signal(signal.SIGKILL)  # the hung process dies holding the lock
        locker.wait(timeout=30)
        locker.stdout.close()
    store = SweepStorage(out=tmp_path, sweep="test")
    assert len(store.records()) == 3 and store.status()["complete"] == 3


def test_a_schema_creation_race_is_retried_not_called_corruption():
    """Two workers opening a new SQLite storage at once: the loser's ``CREATE TABLE`` fails with
    "table ... already exists" and passes when tried again; a storage that is really broken
    still gives the one-line error."""
    from sqlalchemy.exc import OperationalError

    from bayesurl.database import retry
    from bayesurl.sweeps.storage import StorageError

    calls = []

    def racy():
        calls.append(1)
        if len(calls) == 1:
            raise OperationalError(
                "CREATE TABLE studies", {}, Exception("table studies already exists")
            )
        return "opened"

    assert retry(racy, "open", url="sqlite:///x.db") == "opened" and len(calls) == 2

    def broken():
        raise OperationalError("SELECT", {}, Exception("file is not a database"))

    with pytest.raises(StorageError, match="unreadable"):
        retry(broken, "open", url="sqlite:///x.db")


@pytest.mark.parametrize(
    "url",
    [
        "postgresql+psycopg2://ann:s3cr%40t%2Fpw@db-host:5432/bayesurl",
        "postgresql://ann:plainpw@db-host/bayesurl?sslmode=require",
        "mysql+pymysql://root:pa:ss@127.0.0.1/x",
    ],
)
def test_redact_url_hides_the_password_and_keeps_the_rest(url):
    from sqlalchemy.engine import make_url

    from bayesurl.sweeps.storage import redact_url

    shown = redact_url(url)
    given, seen = make_url(url), make_url(shown)
    assert given.password and given.password not in shown and "***" in shown
    assert str(url.split("@")[0].split(":")[-1]) not in shown  # nor its URL-encoded form
    for part in ("drivername", "username", "host", "port", "database", "query"):
        assert getattr(seen, part) == getattr(given, part)
    assert redact_url("sqlite:////tmp/x/sweep.db") == "sqlite:////tmp/x/sweep.db"


def test_a_bad_url_is_one_line_without_its_password():
    from bayesurl.sweeps.storage import StorageError

    for url in (
        "postgresql+psycopg2://ann:Sentinel99@host:notaport/db",
        "nodialect://a:Sentinel99@h/d",
    ):
        with pytest.raises(StorageError) as e:
            SweepStorage(url)
        assert "Sentinel99" not in str(e.value) and "\n" not in str(e.value)
        assert "***" in str(e.value)


def _given_back_then_run_once(store: SweepStorage) -> None:
    """The one run a dead worker left RUNNING is failed as stale within 30 s (the grace period
    is 1 s), waits again, and the next worker runs it exactly once."""
    deadline = time.monotonic() + 30  # the grace period is 1 s
    while store.status()["running"] and time.monotonic() < deadline:
        store.fail_stale()
        time.sleep(0.2)
    assert store.status()["running"] == 0 and store.status()["waiting"] == 1
    calls = []
    store.work(lambda p: calls.append(p) or {"r_auroc": 0.7}, wait=False)
    assert len(calls) == 1
    assert store.status() == {"waiting": 0, "running": 0, "complete": 1, "failed": 0, "total": 1}


def test_a_claim_whose_answer_was_lost_is_given_back_after_the_grace_period(tmp_path):
    """The connection drops after the claim's ``WAITING -> RUNNING`` was committed: the retry
    finds the trial taken. The run must not stay RUNNING forever (Optuna never calls a trial
    without a heartbeat stale): it is failed after the grace period and run once."""
    from sqlalchemy.exc import OperationalError

    store = SweepStorage(out=tmp_path, sweep="lost", heartbeat_interval=1, grace_period=1)
    store.add_runs([{"estimator": "a", "split": 0, "seed": 0}])
    real = store.storage.set_trial_state_values
    dropped = []

    def commit_then_drop(trial_id, state, values=None):
        out = real(trial_id, state=state, values=values)
        if not dropped:
            dropped.append(trial_id)
            raise OperationalError("COMMIT", {}, Exception("server closed the connection"))
        return out

    store.storage.set_trial_state_values = commit_then_drop
    assert store.claim() is None  # taken by the lost first try, nobody's now
    assert store.status()["running"] == 1
    store.storage.set_trial_state_values = real
    _given_back_then_run_once(store)
    assert [f["error"] for f in store.failures()] == ["crashed"]


def test_a_worker_killed_before_its_first_heartbeat_loses_no_run(tmp_path):
    """The claim's ``WAITING -> RUNNING`` is committed and the worker dies before it records a
    heartbeat: Optuna never calls such a trial stale, so the run would stay RUNNING forever.
    It must be failed after the grace period and run once."""
    import optuna

    store = SweepStorage(out=tmp_path, sweep="unbeaten", heartbeat_interval=1, grace_period=1)
    store.add_runs([{"estimator": "a", "split": 0, "seed": 0}])
    (trial,) = store.storage.get_all_trials(store._study_id)
    # the dead worker's only act: the claim's commit, no heartbeat
    store.storage.set_trial_state_values(trial._trial_id, state=optuna.trial.TrialState.RUNNING)
    assert store.status()["running"] == 1
    _given_back_then_run_once(store)


def test_superseded_runs_are_run_again_once_and_the_rest_stay(tmp_path):
    """A fix to some estimators: their finished runs are set aside (kept in the storage,
    marked with the reason), the same plan enqueues and runs only them, and the same call
    again after the re-run changes nothing."""
    store = SweepStorage(out=tmp_path, sweep="fix")
    plan = [{"estimator": e, "split": k, "seed": 0} for e in ("ce", "pvu") for k in range(3)]
    store.add_runs(plan)
    store.work(lambda p: {"r_auroc": 0.5})
    with pytest.raises(ValueError, match="nope"):
        store.supersede(["nope"], "views per image")
    with pytest.raises(ValueError, match="reason"):
        store.supersede(["pvu"], " ")
    assert store.supersede(["pvu"], "views per image") == 3
    assert store.status() == {"waiting": 3, "running": 0, "complete": 3, "failed": 0, "total": 6}
    assert store.add_runs(plan) == 3
    ran = []
    store.work(lambda p: ran.append(p["estimator"]) or {"r_auroc": 0.6})
    assert ran == ["pvu"] * 3
    got = {(r["key"], r["r_auroc"]) for r in store.records()}
    assert got == {(run_key(e, k, 0), 0.5 if e == "ce" else 0.6) for e in ("ce", "pvu")
                   for k in range(3)}  # fmt: skip
    # the same call again: the new runs stand; a reopened storage sees the same
    again = SweepStorage(out=tmp_path, sweep="fix")
    assert again.supersede("pvu", "views per image") == 0 and again.add_runs(plan) == 0
    assert len(again.records()) == 6


def test_a_worker_looks_for_stale_runs_once_per_heartbeat_and_before_it_stops(tmp_path):
    """Each look for stale runs reads every trial of the storage, so a worker does not look
    before every run: once at the start, then only when nothing is left to claim. A run whose
    worker died after claiming it (no heartbeat) turns stale while this worker runs the others
    and is still taken by that last look, not left behind."""
    store = SweepStorage(out=tmp_path, sweep="looks", heartbeat_interval=30, grace_period=1)
    store.add_runs([{"estimator": "m", "split": k, "seed": 0} for k in range(3)])
    dead = store.claim()  # a worker killed right after its claim: no heartbeat ever
    assert dead is not None
    looks, real = [], store.fail_stale
    store.fail_stale = lambda: (looks.append(time.monotonic()), real())[1]
    ran = []

    def fn(params):
        ran.append(params["split"])
        # 3 s for the two live runs: past the 1 s grace period even with Optuna's whole-second
        # heartbeat times and a loaded machine
        time.sleep(1.5)
        return {"v": params["split"]}

    assert store.work(fn, wait=False) == 3
    assert sorted(ran) == [0, 1, 2] and ran[-1] == dead.params["split"]
    # the start, the look that found the dead worker's run stale, the last one
    assert len(looks) == 3
    assert store.status() == {
        "waiting": 0, "running": 0, "complete": 3, "failed": 0, "total": 3
    }  # fmt: skip
