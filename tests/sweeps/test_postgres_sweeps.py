"""The multi-machine road on a real PostgreSQL server: ``bayesurl benchmark --storage
postgresql+psycopg2://... [--worker]`` in separate processes, as the docs show it.

Every test runs against the throwaway server of ``tests/postgres_server.py`` (one per pytest
process). The references are independent of the code under test: a one-process SQLite sweep
for the metrics, the raw Optuna trials in the database for "every run done exactly once"
(one ``COMPLETE`` trial per planned key, the crashed attempts ``FAIL``), and an execution log
appended by each worker for the load test.

Each test prints its figures (``FIGURES ...`` lines: runs planned, done, retried, duplicated,
lost; claim latencies); ``results/benchmarks/postgres_sweeps.txt`` holds them from one run.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("optuna")

pytestmark = pytest.mark.postgres

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "concepts" / "benchmark_protocol.rst"
METRICS = ("r@1", "r_auroc", "ausc", "ece", "ood_auroc")


# --------------------------------------------------------------------------- helpers
def doc_commands() -> dict[str, str]:
    """The try-out block of the multi-machine section of the docs: ``{"lead": line,
    "worker": line}``, as written (``$BAYESURL_STORAGE`` left for the shell to fill)."""
    text = DOC.read_text()
    start = text.index("Try the set-up first")
    block = text[text.index("::", start) + 2 :]
    lines = []
    for line in block.splitlines()[1:]:
        if line.strip() and not line.startswith(" "):
            break  # the end of the literal block
        if line.strip().startswith("bayesurl "):
            lines.append(line.strip())
    out = {"worker" if "--worker" in shlex.split(line) else "lead": line for line in lines}
    assert set(out) == {"lead", "worker"} and len(lines) == 2, lines
    return out


def spawn(line: str, cwd: Path, url: str) -> subprocess.Popen:
    """Run a ``bayesurl ...`` command line (as the docs write it) with bash in ``cwd`` (its own
    "machine"), ``$BAYESURL_STORAGE`` set to ``url`` and ``bayesurl`` this checkout's
    ``python -m bayesurl`` (``exec``: the process is the worker, for signals)."""
    assert line.startswith("bayesurl ")
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "OMP_NUM_THREADS": "1",
        "BAYESURL_STORAGE": url,
    }
    shell = f'bayesurl() {{ exec {shlex.quote(sys.executable)} -m bayesurl "$@"; }}; {line}'
    cwd.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(
        ["bash", "-c", shell],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(procs: list[subprocess.Popen], timeout: float = 600) -> list[tuple[str, str]]:
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=timeout)
        outs.append((out, err))
    return outs


def trials(url: str, sweep: str = "smoke") -> list:
    """The raw Optuna trials of the sweep (the reference view of the database)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.load_study(study_name=f"sweep:{sweep}", storage=url).get_trials(deepcopy=False)


def tally(url: str, planned: int) -> dict[str, int]:
    """Runs planned, done (keys with a COMPLETE trial), retried (keys tried more than once),
    duplicated (keys with more than one COMPLETE trial) and lost (planned keys not done)."""
    import optuna

    st = optuna.trial.TrialState
    by_key: dict[str, list] = {}
    for t in trials(url):
        by_key.setdefault(t.user_attrs["key"], []).append(t)
    complete = {k: sum(t.state == st.COMPLETE for t in ts) for k, ts in by_key.items()}
    started = {
        k: sum(t.state == st.COMPLETE or (t.state == st.FAIL and not t.system_attrs.get(
            "duplicate")) for t in ts)
        for k, ts in by_key.items()
    }  # fmt: skip
    return {
        "planned": planned,
        "keys": len(by_key),
        "done": sum(1 for n in complete.values() if n >= 1),
        "retried": sum(1 for n in started.values() if n > 1),
        "duplicated": sum(1 for n in complete.values() if n > 1),
        "lost": planned - sum(1 for n in complete.values() if n >= 1),
        "running": sum(t.state == st.RUNNING for ts in by_key.values() for t in ts),
    }


def figures(name: str, **values) -> None:
    print(f"\nFIGURES {name}: " + ", ".join(f"{k} {v}" for k, v in values.items()), flush=True)


def results_runs(folder: Path) -> dict[tuple[str, int], dict]:
    from bayesurl.sweeps import read_results

    doc = read_results(folder)
    keyed = {(r["estimator"], int(r["seed"])): r for r in doc["runs"]}
    assert len(keyed) == len(doc["runs"])  # no run counted twice
    return keyed


def wait_until(cond, timeout: float, procs=(), poll: float = 0.2) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        for p in procs:
            if p.poll() is not None:
                raise AssertionError(f"a worker ended early: {p.returncode} {p.stderr.read()}")
        time.sleep(poll)
    raise AssertionError("timed out")


def _state_counter(url: str):
    """A function counting the database's Optuna trials by state (``{"RUNNING": 1, ...}``)
    over one kept connection pool; ``{}`` before Optuna has made its tables."""
    import sqlalchemy

    engine = sqlalchemy.create_engine(url)

    def count() -> dict[str, int]:
        try:
            with engine.connect() as conn:
                rows = conn.execute(
                    sqlalchemy.text("SELECT state, count(*) FROM trials GROUP BY state")
                ).all()
        except sqlalchemy.exc.SQLAlchemyError:
            return {}
        return {str(getattr(state, "name", state)): int(n) for state, n in rows}

    count.engine = engine
    return count


def n_planned(line: str) -> int:
    argv = shlex.split(line)
    methods = argv[argv.index("--methods") + 1].split(",")
    return len(methods) * int(argv[argv.index("--seeds") + 1])


# --------------------------------------------------------------------------- tests
def test_four_workers_as_the_docs_show_match_a_sqlite_sweep_and_leak_no_password(
    postgres, tmp_path
):
    """The docs' try-out lines: one lead and three workers, each in its own folder, on one
    PostgreSQL database. Every run is done once, the metrics equal a one-process SQLite
    sweep's, and the database password appears in no file any process wrote nor in any
    output."""
    cmds = doc_commands()
    url = postgres.new_database()
    assert postgres.password in url
    planned = n_planned(cmds["lead"])
    lead = spawn(cmds["lead"], tmp_path / "machine0", url)
    workers = [spawn(cmds["worker"], tmp_path / f"machine{i}", url) for i in (1, 2, 3)]
    # the reference: the same sweep in one process on a SQLite storage
    ref = spawn(cmds["lead"], tmp_path / "reference", "sqlite:///ref.db")
    outs = finish([lead, *workers, ref])
    for p, (_out, err) in zip([lead, *workers, ref], outs):
        assert p.returncode == 0, err[-3000:]
    t = tally(url, planned)
    figures("four workers", **t)
    assert t["keys"] == t["done"] == planned
    assert t["retried"] == t["duplicated"] == t["lost"] == t["running"] == 0
    here = [int(re.search(r"\((\d+) here\)", o).group(1)) for o, _ in outs[:4]]
    assert sum(here) == planned  # each run executed by exactly one process
    writers = [
        d for d in (tmp_path / f"machine{i}" / "runs/pg-try" for i in range(4))
        if (d / "results.json").exists()
    ]  # fmt: skip
    assert writers, "no worker wrote the results"
    ref_runs = results_runs(tmp_path / "reference" / "runs/pg-try")
    assert len(ref_runs) == planned
    for folder in writers:
        runs = results_runs(folder)
        assert runs.keys() == ref_runs.keys()
        for key, r in runs.items():
            for m in METRICS:
                assert r.get(m) == ref_runs[key].get(m), (key, m)
        settings = json.loads((folder / "results.json").read_text())["settings"]
        assert settings["storage"] == url.replace(postgres.password, "***")
    # no secret in any output: every file written under the machines' folders, every output
    secret = postgres.password.encode()
    checked = []
    for path in sorted(tmp_path.rglob("*")):
        if path.is_file():
            assert secret not in path.read_bytes(), path
            checked.append(path.relative_to(tmp_path).as_posix())
    for out, err in outs:
        assert postgres.password not in out and postgres.password not in err
    assert any(c.endswith("results.json") for c in checked)
    assert any(c.endswith("results.csv") for c in checked)
    assert any(c.endswith("report.html") for c in checked)
    assert any("***@" in o for o, _ in outs[:4])  # the URL was shown, redacted
    names = sorted({re.sub(r"machine\d|[^/]*\.npz$", "*", c) for c in checked})
    print(
        f"\nSENTINEL checked {len(checked)} files ({', '.join(names)}) "
        f"and {2 * len(outs)} outputs (stdout, stderr)"
    )


def _smoke(heartbeat: int, worker: bool = False) -> str:
    """A smoke sweep of 6 runs (2 estimators x 3 seeds) on ``$BAYESURL_STORAGE``."""
    line = 'bayesurl benchmark --preset smoke --storage "$BAYESURL_STORAGE" --out out --poll 0.5'
    line += f" --heartbeat {heartbeat}"
    return line + (" --worker" if worker else " --methods ce,elk --seeds 3")


def test_a_killed_worker_has_its_run_taken_again_after_the_heartbeat(postgres, tmp_path):
    """SIGKILL the only worker in the middle of a run: the next worker fails it as stale after
    the grace period (4 heartbeats) and runs it again; every run done once, none lost."""
    url = postgres.new_database()
    planned = 6
    first = spawn(_smoke(heartbeat=1), tmp_path / "a", url)
    states = _state_counter(url)

    def mid_run():
        # one cheap query per poll: the smoke runs last a second or two, and a poll through
        # Optuna's load_study could miss them all on a loaded machine
        n = states()
        return n.get("COMPLETE", 0) >= 1 and n.get("RUNNING", 0) == 1

    try:
        wait_until(mid_run, 300, [first], poll=0.05)
    finally:
        states.engine.dispose()
    first.send_signal(signal.SIGKILL)
    first.communicate(timeout=60)
    killed = tally(url, planned)
    assert killed["running"] == 1  # the run the worker died in
    t0 = time.monotonic()
    second = spawn(_smoke(heartbeat=1, worker=True), tmp_path / "b", url)
    out, err = second.communicate(timeout=600)
    assert second.returncode == 0, err[-3000:]
    t = tally(url, planned)
    figures("killed worker", **t, heartbeat_s=1, grace_s=4, second_worker_s=round(
        time.monotonic() - t0, 1))  # fmt: skip
    assert t["done"] == planned and t["lost"] == t["duplicated"] == t["running"] == 0
    assert t["retried"] == 1  # the killed run, taken again
    runs = results_runs(tmp_path / "b" / "out")
    assert len(runs) == planned


def _connected(url: str, application_name: str) -> bool:
    """Whether a client with this ``application_name`` holds a connection to the server."""
    import sqlalchemy

    engine = sqlalchemy.create_engine(url, poolclass=sqlalchemy.pool.NullPool)
    try:
        with engine.connect() as conn:
            query = "SELECT count(*) FROM pg_stat_activity WHERE application_name = :a"
            n = conn.execute(sqlalchemy.text(query), {"a": application_name}).scalar()
        return bool(n)
    except Exception:
        return False
    finally:
        engine.dispose()


def test_a_database_restart_mid_sweep_loses_nothing(postgres, tmp_path):
    """``pg_ctl`` stops the server (every connection dropped) while two workers run, and starts
    it again 2 s later: the workers reconnect and finish; every run done once."""
    url = postgres.new_database()
    planned = 6
    lead = spawn(_smoke(heartbeat=3), tmp_path / "a", url)

    def mid_run():
        try:
            return tally(url, planned)["running"] >= 1 and tally(url, planned)["done"] >= 1
        except Exception:
            return False

    wait_until(lambda: (tmp_path / "a" / "out").exists(), 300, [lead])
    # the worker names its connections, so that the restart waits until it has joined: a
    # database down while a worker starts is an error at once, by design, not a lost connection
    worker_url = f"{url}?application_name=restart-worker"
    worker = spawn(_smoke(heartbeat=3, worker=True), tmp_path / "b", worker_url)
    wait_until(lambda: mid_run() and _connected(url, "restart-worker"), 300, [lead, worker])
    time.sleep(1.0)  # past the worker's first connection, which must find the server up
    before = tally(url, planned)
    postgres.restart(down=2.0)
    outs = finish([lead, worker])
    for p, (_out, err) in zip([lead, worker], outs):
        assert p.returncode == 0, err[-3000:]
    t = tally(url, planned)
    figures("database restart", **t, done_before_restart=before["done"], down_s=2)
    assert t["done"] == planned and t["lost"] == t["duplicated"] == t["running"] == 0
    here = [int(re.search(r"\((\d+) here\)", o).group(1)) for o, _ in outs]
    # every run executed once, or once more when the restart outlasted its grace period
    assert sum(here) == planned + t["retried"]


def test_unreachable_database_wrong_password_missing_driver_are_one_line_exit_2(postgres, tmp_path):
    url = postgres.new_database()
    wrong = url.replace(postgres.password, "wrong-" + postgres.password[::-1])
    cases = {
        "unreachable": url.replace(f":{postgres.port}/", ":1/"),
        "wrong password": wrong,
        "missing driver": url.replace("+psycopg2", "+pg8000"),
    }
    expect = {
        "unreachable": "does not answer",
        "wrong password": "password authentication failed",
        "missing driver": "pip install 'bayesurl[postgres]'",
    }
    procs = {
        k: spawn(_smoke(heartbeat=1), tmp_path / k.replace(" ", "_"), u) for k, u in cases.items()
    }
    for k, p in procs.items():
        out, err = p.communicate(timeout=300)
        lines = err.strip().splitlines()
        print(f"\n{k}: exit {p.returncode}: {err.strip()}")
        assert p.returncode == 2 and len(lines) == 1, err
        assert lines[0].startswith("bayesurl benchmark: error: sweep storage postgresql+")
        assert expect[k] in lines[0] and "***@127.0.0.1" in lines[0]
        for secret in (postgres.password, "wrong-" + postgres.password[::-1]):
            assert secret not in out + err


LOAD_WORKER = textwrap.dedent(
    """
    import importlib.util, json, os, sys, time
    # the storage module alone (stdlib + Optuna): sixteen processes need not each import torch
    spec = importlib.util.spec_from_file_location("storage", sys.argv[1])
    storage = importlib.util.module_from_spec(spec)
    sys.modules["storage"] = storage  # dataclasses look their module up
    spec.loader.exec_module(storage)
    url, log, sleep = sys.argv[2], sys.argv[3], float(sys.argv[4])
    store = storage.SweepStorage(url, sweep="load", heartbeat_interval=5)
    latencies, cpu = [], []
    claim = store.claim

    def timed_claim():  # the worker loop's own claims, timed (wall and this process's CPU)
        t0, c0 = time.perf_counter(), time.process_time()
        try:
            return claim()
        finally:
            latencies.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)

    store.claim = timed_claim

    def run(params):
        with open(log, "a") as fh:  # one O_APPEND write per started run
            fh.write(f"{params['seed']} {os.getpid()}\\n")
        time.sleep(sleep)
        return {"r_auroc": 0.5}

    done = store.work(run, poll=0.2)
    print(json.dumps({"done": done, "latencies": latencies, "cpu": cpu}), flush=True)
    """
)


def test_sixteen_workers_never_claim_a_run_twice(postgres, tmp_path):
    """16 worker processes claim 64 short runs (0.05 s) from one PostgreSQL storage: every run
    is started exactly once; the claim latency (one ``SweepStorage.claim`` call, under the
    load of the other 15) is printed."""
    url = postgres.new_database()
    n_runs, n_workers = 64, 16
    script = tmp_path / "load_worker.py"
    script.write_text(LOAD_WORKER)
    log = tmp_path / "log.txt"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    argv = [str(ROOT / "bayesurl" / "sweeps" / "storage.py"), url, str(log), "0.05"]
    # the lead plans the sweep; the workers (as `--worker`) only claim and run
    from bayesurl.sweeps.storage import SweepStorage

    lead = SweepStorage(url, sweep="load")
    assert lead.add_runs([{"estimator": "m", "split": 0, "seed": s} for s in range(n_runs)])
    lead.storage.engine.dispose()
    t0 = time.monotonic()
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), *argv],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(n_workers)
    ]
    outs = finish(procs)
    wall = time.monotonic() - t0
    for p, (_out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
    reports = [json.loads(o.strip().splitlines()[-1]) for o, _ in outs]
    starts = Counter(line.split()[0] for line in log.read_text().splitlines())
    assert len(starts) == n_runs and max(starts.values()) == 1  # none lost, none twice
    assert sum(r["done"] for r in reports) == n_runs
    import optuna

    st = optuna.trial.TrialState
    tr = trials(url, "load")
    complete = Counter(x.user_attrs["key"] for x in tr if x.state == st.COMPLETE)
    assert len(complete) == n_runs and max(complete.values()) == 1
    crashed = [x for x in tr if x.state == st.FAIL and not x.system_attrs.get("duplicate")]
    assert not crashed
    lat = sorted(x for r in reports for x in r["latencies"])
    q = lambda f: lat[min(len(lat) - 1, int(f * len(lat)))] * 1000  # noqa: E731
    figures(
        "16 workers",
        planned=n_runs,
        done=len(complete),
        retried=len(crashed),
        duplicated=sum(n - 1 for n in starts.values()),
        lost=n_runs - len(complete),
        workers_that_ran=sum(1 for r in reports if r["done"]),
        claims=len(lat),
        claim_ms_median=round(q(0.5), 1),
        claim_ms_p95=round(q(0.95), 1),
        claim_ms_max=round(lat[-1] * 1000, 1),
        claim_cpu_ms_median=round(
            sorted(c for r in reports for c in r["cpu"])[len(lat) // 2] * 1000, 1
        ),
        load_average=round(os.getloadavg()[0], 1),
        wall_s=round(wall, 1),
    )


def test_a_connection_lost_while_the_storage_opens_is_waited_for(postgres, monkeypatch):
    """The server answered the first connection, then dropped one while Optuna checked its
    schema (a restart at that moment): the storage waits and opens, not exit at once."""
    import optuna
    import sqlalchemy.exc

    from bayesurl.sweeps.storage import SweepStorage

    url = postgres.new_database()
    real, calls = optuna.storages.RDBStorage, []

    class DropsOnce(real):
        def __init__(self, *args, **kwargs):
            calls.append(1)
            if len(calls) == 1:
                raise sqlalchemy.exc.OperationalError(
                    "SELECT 1", {}, Exception("server closed the connection unexpectedly")
                )
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(optuna.storages, "RDBStorage", DropsOnce)
    store = SweepStorage(url, sweep="opens")
    assert len(calls) == 2 and store.status()["total"] == 0
