"""Where a sweep's runs live: one interface (:class:`RunStore`), kept in memory
(:class:`MemoryStore`) or in Optuna's RDB storage (:class:`SweepStorage`: claim-a-run
semantics for resumable, multi-worker sweeps).

A benchmark sweep is a fixed plan of runs, one per (estimator, class split, seed) (URL,
Kirchhof et al., 2023, section 3: every model is replicated over seeds and downstream sets and
averaged). :class:`SweepStorage` keeps that plan, each run's state and each finished run's
record in an Optuna RDB storage (:class:`optuna.storages.RDBStorage`):

* a SQLite file ``<out>/sweep.db`` by default (kill the sweep and start it again: finished runs
  are not repeated), or any SQLAlchemy URL, e.g. ``postgresql://user:pw@host/db``, shared by
  workers on several machines (one ``bayesurl benchmark --worker`` per machine or GPU);
* one Optuna study per sweep (``"sweep:<name>"``); every run is an Optuna trial whose user
  attributes hold the run's key (``"<estimator>/split<k>/seed<s>"``), its parameters (with
  the run's resolved config, :func:`bayesurl.sweeps.plan.plan_sweep`, which a worker rebuilds
  instead of reading the recipe again) and, once finished, its record (metrics, settings,
  timings). Hyper-parameter searches
  (:meth:`SweepStorage.tuning_study`) are further studies in the same storage, so runs and
  trials live in one database that ``optuna-dashboard <url>`` can show.

**Claiming.** A run is enqueued as a ``WAITING`` trial. A worker claims it by the storage's
atomic ``WAITING -> RUNNING`` transition (:meth:`optuna.storages.RDBStorage.set_trial_state_values`
reads the row ``FOR UPDATE`` on PostgreSQL; on SQLite every transaction begins with
``BEGIN IMMEDIATE``, so the read and the write hold the lock together), so two workers never
get the same trial. Enqueueing is idempotent:
every worker adds the plan's missing keys at start. Two workers starting at once may both
enqueue a key; then the key's **canonical** trial is the one with the smallest trial id among
its ``WAITING`` / ``RUNNING`` / ``COMPLETE`` trials, and a worker that claims any other trial of
that key (checked again after its claim is committed) retires it as a duplicate without running
it. A run is done once its canonical trial is ``COMPLETE``.

**Crashes.** While a run executes, a thread records Optuna heartbeats; a ``RUNNING`` trial
whose heartbeat is older than ``grace_period`` (the worker was killed, the machine lost) is
failed by the next worker that looks (:func:`optuna.storages.fail_stale_trials`) and its key is
enqueued again. A run whose function raises is recorded as ``FAIL`` with the error and tried
again; crashes and errors together get ``max_attempts`` attempts per run, after which the run is
reported as failed (:meth:`SweepStorage.failures`; ``add_runs(..., retry_failed=True)`` gives
it one more). Ctrl-C or SIGTERM gives the claimed run back at once (``FAIL`` marked
``interrupted``, not counted as an attempt).

**Connections.** A database that does not answer a worker's first connection, refuses the
login (wrong password) or needs a driver that is not installed is a :class:`StorageError` at
once (one line). A connection lost after that (the database restarted, the network down),
while the storage is opened or while the sweep runs, is waited for: every storage call
retries for up to ``lock_timeout`` seconds, with the engine's connections checked before use
(``pool_pre_ping``); a run in progress keeps running meanwhile. Retried writes are
idempotent (a second enqueue of a key is retired as a duplicate, a second ``COMPLETE`` is
ignored). How the database is reached, waited for and named is :mod:`bayesurl.database`.

**Secrets.** The URL may carry a database password: :attr:`SweepStorage.url`, every error
message and therefore every results file and progress line show it with the password as
``***`` (:func:`bayesurl.database.redact_url`); the full URL is used to connect only.

Optuna is an optional dependency: ``pip install bayesurl[sweep]`` (``bayesurl[postgres]``
adds the PostgreSQL driver psycopg2).
"""

from __future__ import annotations

import contextlib
import datetime
import json
import math
import os
import signal
import sqlite3
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from bayesurl._optional import require
from bayesurl.database import (
    LOCK_TIMEOUT,
    StorageError,
    check_url,
    corrupted,
    dialect_hint,
    enable_wal,
    engine_options,
    one_line,
    probe,
    redact_url,
    retry,
    scrub,
    serialise_sqlite,
)

# LOCK_TIMEOUT, StorageError and redact_url are bayesurl.database's, named here too: a sweep
# storage's user catches its errors and prints its URL from this module
__all__ = [
    "LOCK_TIMEOUT",
    "SWEEP_FORMAT",
    "Claim",
    "MemoryStore",
    "OnDone",
    "RunFn",
    "RunStore",
    "StorageError",
    "SweepStorage",
    "default_storage_url",
    "redact_url",
    "require_optuna",
    "run_key",
    "run_label",
]

#: Default file name of the SQLite storage inside the output folder.
DEFAULT_DB = "sweep.db"
#: The layout of a sweep's runs in the storage (a study user attribute; a reader refuses a
#: newer one). A :func:`bayesurl.files.format_of` tag, written out: this module imports
#: nothing of bayesurl at load time, so a worker process needs no torch.
SWEEP_FORMAT = "bayesurl.sweep/1"


def require_optuna() -> Any:
    """Import Optuna or raise an :class:`ImportError` that says how to install it."""
    return require("optuna", "the sweep storage (and --tune)")


def run_key(estimator: str, split: int, seed: int) -> str:
    """The key of one run, ``"<estimator>/split<split>/seed<seed>"``.

    Raises
    ------
    ValueError
        If ``estimator`` is empty or contains ``/``, or ``split`` / ``seed`` is negative.
    """
    est = str(estimator).strip()
    if not est or "/" in est:
        raise ValueError(f"`estimator` must be a non-empty name without '/', got {estimator!r}")
    from bayesurl._checks import check_int  # here: a worker loads this module without torch

    for arg, v in (("split", split), ("seed", seed)):
        check_int(v, arg, low=0)
    return f"{est}/split{int(split)}/seed{int(seed)}"


def default_storage_url(out: str | os.PathLike[str]) -> str:
    """``sqlite:///<out>/sweep.db`` (absolute path; the folder is created)."""
    folder = Path(out).expanduser().resolve()
    folder.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{folder / DEFAULT_DB}"


@dataclass(frozen=True)
class Claim:
    """A run claimed by this worker: its key, parameters and the Optuna trial holding it
    (in a :class:`MemoryStore`: the run's place in the plan)."""

    key: str
    params: dict[str, Any]
    trial_id: int
    attempt: int


#: One run: ``fn(params) -> record``.
RunFn = Callable[[dict[str, Any]], Mapping[str, Any]]
#: Called after each run: ``on_done(claim, record, error)`` (``record`` is ``None`` when the
#: run raised; ``error`` is the exception's text, or the error the record carries).
OnDone = Callable[[Claim, Mapping[str, Any] | None, str | None], None]


@runtime_checkable
class RunStore(Protocol):
    """Where a sweep's runs live: what the sweep engine (:func:`bayesurl.sweeps.run_sweep`)
    and the tuning (:func:`bayesurl.sweeps.tuning.tune_estimators`) ask of it.

    Implemented by :class:`MemoryStore` (one process, nothing kept) and :class:`SweepStorage`
    (an Optuna RDB storage: resumable, shared by workers).
    """

    #: The storage's address, safe to print and to store (no password).
    url: str

    def add_runs(self, runs: Iterable[Mapping[str, Any]]) -> int:
        """Plan the runs not planned yet; how many were added."""
        ...

    def work(
        self, fn: RunFn, *, wait: bool = True, poll: float = 5.0, on_done: OnDone | None = None
    ) -> int:
        """Execute planned runs with ``fn`` until none is left; how many this process ran
        (``wait``: also for runs other workers hold, looking every ``poll`` seconds)."""
        ...

    def status(self) -> dict[str, int]:
        """Counts of the plan's runs: ``waiting``, ``running``, ``complete``, ``failed``,
        ``total``."""
        ...

    def records(self) -> list[dict[str, Any]]:
        """The finished runs' records, in plan order."""
        ...

    def failures(self) -> list[dict[str, Any]]:
        """``{"key", "error", ...}`` of every failed attempt."""
        ...

    def other_sweeps(self) -> list[str]:
        """Names of other sweeps with runs in the same storage."""
        ...

    def tuning_study(self, name: str, *, sampler: Any = None) -> Any:
        """The Optuna study (maximise) of the hyper-parameter search ``name``."""
        ...


class MemoryStore:
    """The runs of a sweep kept in this process (a :class:`RunStore`, the in-memory twin of
    :class:`SweepStorage`).

    A run function's exception propagates (a run records its own failure unless it is asked
    to raise).
    """

    def __init__(self) -> None:
        self._plan: list[dict[str, Any]] = []
        self._records: list[dict[str, Any]] = []
        self._studies: dict[str, Any] = {}
        self.url = "memory"

    def add_runs(self, runs: Iterable[Mapping[str, Any]]) -> int:
        """Append the runs; return how many."""
        new = [dict(r) for r in runs]
        self._plan += new
        return len(new)

    def work(
        self, fn: RunFn, *, wait: bool = True, poll: float = 5.0, on_done: OnDone | None = None
    ) -> int:
        """Run every planned run in order; return how many (nothing to wait for here)."""
        done = 0
        while len(self._records) < len(self._plan):
            i = len(self._records)
            params = self._plan[i]
            record = dict(fn(dict(params)))
            self._records.append(record)
            done += 1
            if on_done is not None:
                claim = Claim(key=run_label(params), params=params, trial_id=i, attempt=1)
                on_done(claim, record, record.get("error"))
        return done

    def status(self) -> dict[str, int]:
        """Counts of the plan's runs (``failed``: runs whose record carries an error)."""
        failed = sum(bool(r.get("error")) for r in self._records)
        return {
            "waiting": len(self._plan) - len(self._records),
            "running": 0,
            "complete": len(self._records) - failed,
            "failed": failed,
            "total": len(self._plan),
        }

    def records(self) -> list[dict[str, Any]]:
        """The finished runs' records, in plan order."""
        return [dict(r) for r in self._records]

    def failures(self) -> list[dict[str, Any]]:
        """``{"key", "error"}`` of the runs that failed."""
        return [
            {"key": run_label(p), "error": r["error"]}
            for p, r in zip(self._plan, self._records)
            if r.get("error")
        ]

    def other_sweeps(self) -> list[str]:
        """None: the store holds this sweep alone."""
        return []

    def tuning_study(self, name: str, *, sampler: Any = None) -> Any:
        """An in-memory Optuna study (maximise) per ``name``."""
        optuna = require_optuna()
        if name not in self._studies:
            self._studies[name] = optuna.create_study(direction="maximize", sampler=sampler)
        return self._studies[name]


def run_label(params: Mapping[str, Any]) -> str:
    """A run's progress label from its parameters: ``"ce seed 0"`` on the standard split,
    ``"ce split 1 seed 0"`` on a class split (its key: :func:`run_key`)."""
    split = "" if params.get("class_split") is None else f" split {params.get('split')}"
    return f"{params.get('estimator')}{split} seed {params.get('seed')}"


def _quiet(fn: Callable[[], Any]) -> Callable[[], Any]:
    """``fn`` without Optuna's ExperimentalWarning (heartbeats are 'experimental' since 2.9)."""
    optuna = require_optuna()

    def go() -> Any:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return fn()

    return go


class _Heartbeat:
    """Background thread recording Optuna heartbeats of one trial until stopped."""

    def __init__(self, storage: Any, trial_id: int, interval: float) -> None:
        self._storage, self._trial_id, self._interval = storage, trial_id, interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, daemon=True)

    def _beat(self) -> None:
        while not self._stop.wait(self._interval):
            with contextlib.suppress(Exception):  # a missed beat only ages the trial
                self._storage.record_heartbeat(self._trial_id)

    def __enter__(self) -> _Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """Turn SIGTERM into :class:`KeyboardInterrupt` (main thread only) so a killed worker
    gives its run back."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class SweepStorage:
    """A sweep's plan, claims and records in an Optuna RDB storage (see module docs); a
    :class:`RunStore`.

    Parameters
    ----------
    url : str, optional
        SQLAlchemy URL of the storage (``sqlite:///path.db``, ``postgresql://...``). Default:
        ``sqlite:///<out>/sweep.db``.
    out : path-like, optional
        Output folder of the default SQLite file; required when ``url`` is ``None``.
    sweep : str
        Sweep name; the runs live in the Optuna study ``"sweep:<sweep>"``.
    heartbeat_interval : int
        Seconds between heartbeats of a running run.
    grace_period : int, optional
        Seconds without a heartbeat after which a running run counts as crashed and is given
        to another worker. Default ``4 * heartbeat_interval``.
    max_attempts : int
        Attempts per run (crashes and errors) before the sweep gives up on it.
    lock_timeout : float
        Seconds a storage call waits for another process's lock (e.g. a SQLite file held by a
        hung process), or for a database that stopped answering (restarted) to come back,
        before :class:`StorageError`.

    Attributes
    ----------
    url : str
        The storage URL with its password hidden (``***``): safe to print and to store.

    Raises
    ------
    ValueError
        If neither ``url`` nor ``out`` is given, ``sweep`` is empty, or a number is not
        positive.
    StorageError
        (a ``ValueError``) If the storage is not a database, is corrupted, or stays locked
        longer than ``lock_timeout``; if ``url`` is not a URL, its database does not answer
        or refuses the login, or its driver is not installed; one line naming it (password
        hidden). The storage is left untouched.
    ImportError
        If Optuna is not installed.

    Examples
    --------
    >>> store = SweepStorage(out="results/sweeps/standard")  # doctest: +SKIP
    >>> store.add_runs([{"estimator": "ce", "split": 0, "seed": 0}])  # doctest: +SKIP
    >>> store.work(lambda params: {"r_auroc": 0.6})  # doctest: +SKIP
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        out: str | os.PathLike[str] | None = None,
        sweep: str = "benchmark",
        heartbeat_interval: int = 30,
        grace_period: int | None = None,
        max_attempts: int = 2,
        lock_timeout: float = LOCK_TIMEOUT,
    ) -> None:
        optuna = require_optuna()
        from sqlalchemy.exc import ArgumentError, DatabaseError

        if url is None:
            if out is None:
                raise ValueError("give `url` (SQLAlchemy URL) or `out` (folder of sweep.db)")
            url = default_storage_url(out)
        if not str(url).strip():
            raise ValueError("`url` must be a non-empty SQLAlchemy URL")
        if not str(sweep).strip():
            raise ValueError("`sweep` must be a non-empty name")
        # whole numbers checked here, not by bayesurl._checks: a worker process loads this
        # module alone, without torch
        for arg, v in (
            ("heartbeat_interval", heartbeat_interval),
            ("max_attempts", max_attempts),
            ("grace_period", 1 if grace_period is None else grace_period),
        ):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"`{arg}` must be an integer >= 1, got {v!r}")
        grace = 4 * int(heartbeat_interval) if grace_period is None else int(grace_period)
        if grace < 1:
            raise ValueError(f"`grace_period` must be a positive integer, got {grace_period}")
        self._url = str(url)
        #: the storage URL with its password hidden (for messages and results files)
        self.url = redact_url(self._url)
        check_url(self._url)
        self.sweep = str(sweep)
        self.max_attempts = int(max_attempts)
        self.heartbeat_interval = int(heartbeat_interval)
        self.grace_period = grace
        self._beaten: set[int] = set()  # running trials given their one heartbeat here
        if not (isinstance(lock_timeout, (int, float)) and lock_timeout > 0):
            raise ValueError(f"`lock_timeout` must be a positive number, got {lock_timeout!r}")
        self.lock_timeout = float(lock_timeout)
        try:
            self._open(optuna)
        except (sqlite3.DatabaseError, DatabaseError) as exc:  # not a database, malformed
            raise corrupted(self._url, exc) from None
        except ArgumentError as exc:
            raise StorageError(
                f"sweep storage {self.url}: {scrub(one_line(exc), self._url)}"
                + dialect_hint(self._url)
            ) from None
        except ImportError as exc:  # the URL's database driver is not installed
            raise StorageError(
                f"sweep storage {self.url} needs a database driver that is not installed "
                f"({one_line(exc)}); for postgresql+psycopg2:// run "
                "pip install 'bayesurl[postgres]'"
            ) from None

    def _open(self, optuna: Any) -> None:
        from sqlalchemy.engine import make_url
        from sqlalchemy.exc import IntegrityError, ProgrammingError

        enable_wal(self._url, self.lock_timeout)
        engine_kwargs = engine_options(self._url, self.lock_timeout)
        server = make_url(self._url).get_backend_name() != "sqlite"
        if server:
            # one plain connection first: a server that does not answer at start is an error
            # at once; one lost after it answered (restarted while Optuna checks its schema)
            # is waited for, as it is during the sweep
            self._retry(
                lambda: probe(self._url, engine_kwargs.get("connect_args", {})),
                "connect",
                reconnect=False,
            )
        self._storage = self._retry(
            _quiet(
                lambda: optuna.storages.RDBStorage(
                    self._url,
                    engine_kwargs=engine_kwargs,
                    heartbeat_interval=self.heartbeat_interval,
                    grace_period=self.grace_period,
                )
            ),
            "open storage",
            # two processes creating the schema at once: the loser's alembic stamp (or, on
            # PostgreSQL, its CREATE TABLE) fails
            also=(IntegrityError, ProgrammingError),
            reconnect=server,
        )
        if not server:
            serialise_sqlite(self._storage.engine)
        self._study = self._retry(
            lambda: optuna.create_study(
                study_name=f"sweep:{self.sweep}",
                storage=self._storage,
                direction="maximize",
                load_if_exists=True,
            ),
            "create study",
        )
        self._study_id = self._study._study_id
        self._check_format()

    def _check_format(self) -> None:
        """Refuse a sweep written by a newer bayesurl (or not by bayesurl); stamp ours on a new
        one and on one from before sweeps carried a format."""
        attrs = self._retry(
            lambda: self._storage.get_study_user_attrs(self._study_id), "read the format"
        )
        found = attrs.get("format")
        if found is None:
            self._retry(
                lambda: self._storage.set_study_user_attr(self._study_id, "format", SWEEP_FORMAT),
                "stamp the format",
            )
            return
        if found == SWEEP_FORMAT:
            return
        from bayesurl.files import FormatError, check_format

        try:
            check_format({"format": found}, self.url, SWEEP_FORMAT)
        except FormatError as exc:
            raise StorageError(f"sweep storage {exc} (sweep {self.sweep!r})") from None

    def _retry(
        self,
        fn: Callable[[], Any],
        what: str,
        also: tuple[type[BaseException], ...] = (),
        reconnect: bool = True,
    ) -> Any:
        """:func:`bayesurl.database.retry` with this storage's lock timeout and URL in its
        errors; Optuna's wrapped storage errors are retried too."""
        optuna = require_optuna()
        also = (optuna.exceptions.StorageInternalError, *also)
        return retry(
            fn, what, also=also, wait=self.lock_timeout, url=self._url, reconnect=reconnect
        )

    # ------------------------------------------------------------------ reading
    @property
    def storage(self) -> Any:
        """The :class:`optuna.storages.RDBStorage`."""
        return self._storage

    def _trials(self) -> list[Any]:
        return self._retry(
            lambda: self._storage.get_all_trials(self._study_id, deepcopy=False), "read trials"
        )

    def _by_key(self) -> dict[str, list[Any]]:
        groups: dict[str, list[Any]] = {}
        for t in self._trials():
            key = t.user_attrs.get("key")
            if key is not None:
                groups.setdefault(key, []).append(t)
        for ts in groups.values():
            ts.sort(key=lambda t: t._trial_id)
        return groups

    @staticmethod
    def _live(trials: Iterable[Any]) -> list[Any]:
        optuna = require_optuna()
        live = (
            optuna.trial.TrialState.WAITING,
            optuna.trial.TrialState.RUNNING,
            optuna.trial.TrialState.COMPLETE,
        )
        return [t for t in trials if t.state in live and not t.system_attrs.get("superseded")]

    @staticmethod
    def _attempts(trials: Iterable[Any]) -> int:
        optuna = require_optuna()
        return sum(
            1
            for t in trials
            if t.state == optuna.trial.TrialState.FAIL
            and not t.system_attrs.get("duplicate")
            and not t.system_attrs.get("interrupted")
        )

    def status(self) -> dict[str, int]:
        """Counts of the plan's runs: ``waiting``, ``running``, ``complete``, ``failed``
        (given up: no live trial and ``max_attempts`` used), ``total``."""
        optuna = require_optuna()
        st = optuna.trial.TrialState
        out = {"waiting": 0, "running": 0, "complete": 0, "failed": 0, "total": 0}
        for ts in self._by_key().values():
            out["total"] += 1
            live = self._live(ts)
            if not live:
                # set aside to be run again (enqueued by the next add_runs), or given up
                again = any(t.system_attrs.get("superseded") for t in ts)
                out[
                    "waiting" if again and self._attempts(ts) < self.max_attempts else "failed"
                ] += 1
                continue
            state = live[0].state
            name = {st.WAITING: "waiting", st.RUNNING: "running", st.COMPLETE: "complete"}[state]
            out[name] += 1
        return out

    def other_sweeps(self) -> list[str]:
        """Names of the other sweeps with runs in the same storage (a worker given the wrong
        ``--preset`` finds them here instead of waiting for a plan that never comes)."""
        studies = self._retry(lambda: self._storage.get_all_studies(), "list studies")
        names = []
        for st in studies:
            name = st.study_name
            if not name.startswith("sweep:") or name == f"sweep:{self.sweep}":
                continue
            sid = self._storage.get_study_id_from_name(name)
            if self._storage.get_n_trials(sid) > 0:
                names.append(name.removeprefix("sweep:"))
        return sorted(names)

    def records(self) -> list[dict[str, Any]]:
        """The records of the finished runs (one per key, the canonical trial's), in the
        plan's order."""
        optuna = require_optuna()
        out = []
        for ts in self._by_key().values():
            live = self._live(ts)
            if live and live[0].state == optuna.trial.TrialState.COMPLETE:
                out.append(dict(live[0].user_attrs.get("record", {})))
        return out

    def failures(self) -> list[dict[str, Any]]:
        """``{"key", "params", "error"}`` of every failed attempt (errors and crashes)."""
        optuna = require_optuna()
        out = []
        for key, ts in self._by_key().items():
            for t in ts:
                if t.state != optuna.trial.TrialState.FAIL or t.system_attrs.get("duplicate"):
                    continue
                out.append(
                    {
                        "key": key,
                        "params": dict(t.user_attrs.get("params", {})),
                        "error": t.user_attrs.get("error")
                        or ("interrupted" if t.system_attrs.get("interrupted") else "crashed"),
                    }
                )
        return out

    # ------------------------------------------------------------------ writing
    def add_runs(self, runs: Iterable[Mapping[str, Any]], *, retry_failed: bool = False) -> int:
        """Enqueue the runs of the plan that are not yet in the storage (idempotent).

        Parameters
        ----------
        runs : iterable of mapping
            Each with ``"estimator"``, ``"split"``, ``"seed"`` and any further JSON-able
            parameters the run function needs (they are stored with the run).
        retry_failed : bool
            Also enqueue runs that failed ``max_attempts`` times (one more attempt).

        Returns
        -------
        int
            Number of runs enqueued.

        Raises
        ------
        ValueError
            If a run lacks ``estimator`` / ``split`` / ``seed`` or a key appears twice.
        """
        optuna = require_optuna()
        plan: dict[str, dict[str, Any]] = {}
        for r in runs:
            missing = [k for k in ("estimator", "split", "seed") if k not in r]
            if missing:
                raise ValueError(f"a run in `runs` lacks {missing}: {dict(r)!r}")
            key = run_key(r["estimator"], r["split"], r["seed"])
            if key in plan:
                raise ValueError(f"run {key!r} appears twice in `runs`")
            plan[key] = dict(r)
        groups = self._by_key()
        added = 0
        for key, params in plan.items():
            ts = groups.get(key, [])
            if self._live(ts):
                continue
            attempts = self._attempts(ts)
            if attempts >= self.max_attempts and not retry_failed:
                continue
            template = optuna.trial.create_trial(
                state=optuna.trial.TrialState.WAITING,
                user_attrs={"key": key, "params": params, "attempt": attempts + 1},
            )
            self._retry(
                lambda t=template: self._storage.create_new_trial(self._study_id, t), "enqueue"
            )
            added += 1
        return added

    def supersede(self, estimators: Iterable[str], reason: str) -> int:
        """Set the finished runs of ``estimators`` aside so that the sweep runs them again.

        For a protocol some of whose estimators changed (a fix): each key of ``estimators``
        whose run is finished gets its trial marked ``superseded`` (with ``reason``); the trial
        and its record stay in the storage, but no longer count, so the next :meth:`add_runs`
        of the plan enqueues the key again and the sweep, started as before, runs only those.
        Idempotent per ``reason``: a key already superseded for ``reason`` is left alone (its
        new run stands), so the same call after a resumed re-run changes nothing.

        Returns
        -------
        int
            How many runs were set aside.

        Raises
        ------
        ValueError
            If ``estimators`` is empty or names an estimator with no run in the storage, or
            ``reason`` is empty.
        """
        optuna = require_optuna()
        from sqlalchemy import text

        names = [
            str(e).strip() for e in ([estimators] if isinstance(estimators, str) else estimators)
        ]
        names = [n for n in names if n]
        if not names:
            raise ValueError("`estimators` must name at least one estimator")
        why = str(reason).strip()
        if not why:
            raise ValueError("`reason` must say why the runs are superseded")
        groups = self._by_key()
        known = {key.split("/")[0] for key in groups}
        unknown = [n for n in names if n not in known]
        if unknown:
            raise ValueError(
                f"`estimators` {unknown} have no runs in the storage {self.url} (it holds "
                f"{', '.join(sorted(known)) or 'none'})"
            )
        marked = 0
        for key, ts in groups.items():
            if key.split("/")[0] not in names:
                continue
            if any(t.system_attrs.get("superseded") == why for t in ts):
                continue
            live = self._live(ts)
            if not live or live[0].state != optuna.trial.TrialState.COMPLETE:
                continue
            trial_id = live[0]._trial_id

            def mark(trial_id: int = trial_id) -> None:
                # Optuna keeps a finished trial's attributes read-only: one row of its table
                with self._storage.engine.begin() as conn:
                    conn.execute(
                        text(
                            "INSERT INTO trial_system_attributes (trial_id, key, value_json) "
                            "VALUES (:trial_id, 'superseded', :value)"
                        ),
                        {"trial_id": trial_id, "value": json.dumps(why)},
                    )

            self._retry(mark, "supersede")
            marked += 1
        return marked

    def fail_stale(self) -> None:
        """Fail running trials whose heartbeat is older than ``grace_period`` (crashed
        workers) and enqueue their keys again (up to ``max_attempts``)."""
        optuna = require_optuna()
        self._retry(_quiet(lambda: optuna.storages.fail_stale_trials(self._study)), "fail stale")
        self._beat_unbeaten()
        self.add_runs(
            [
                dict(ts[-1].user_attrs["params"])
                for ts in self._by_key().values()
                if not self._live(ts) and self._attempts(ts) < self.max_attempts
            ]
        )

    def _beat_unbeaten(self) -> None:
        """One heartbeat for each running trial older than ``grace_period`` that this process
        has not seen before.

        A worker killed between its claim's commit and its first heartbeat leaves a RUNNING
        trial without any heartbeat, and Optuna never calls such a trial stale. One beat makes
        it eligible: if nobody beats it again it is failed after ``grace_period``. A trial of a
        live worker is beaten anyway, so the extra beat changes nothing; a trial is beaten at
        most once per process, so a dead worker's stale beat is not kept fresh by the pollers.
        """
        optuna = require_optuna()
        now = datetime.datetime.now()
        for t in self._trials():
            if (
                t.state == optuna.trial.TrialState.RUNNING
                and t._trial_id not in self._beaten
                and t.datetime_start is not None
                and (now - t.datetime_start).total_seconds() > self.grace_period
            ):
                self._beaten.add(t._trial_id)
                self._retry(lambda t=t: self._storage.record_heartbeat(t._trial_id), "heartbeat")

    def claim(self) -> Claim | None:
        """Claim one waiting run for this worker (``WAITING -> RUNNING``), or ``None``.

        Returns
        -------
        Claim or None
            ``None`` when no run is waiting (others may still be running).
        """
        optuna = require_optuna()
        st = optuna.trial.TrialState
        while True:
            groups = self._by_key()
            waiting = [
                ts_live[0]
                for ts_live in (self._live(ts) for ts in groups.values())
                if ts_live and ts_live[0].state == st.WAITING
            ]
            dupes = [
                t for ts in groups.values() for t in self._live(ts)[1:] if t.state == st.WAITING
            ]
            for t in dupes:  # enqueued twice by racing workers: retire the copies
                if self._take(t._trial_id):
                    self._retire(t._trial_id, "duplicate")
            if not waiting:
                return None
            for t in waiting:
                if not self._take(t._trial_id):
                    continue  # another worker was faster
                self._retry(lambda t=t: self._storage.record_heartbeat(t._trial_id), "heartbeat")
                key = t.user_attrs["key"]
                # re-check after the commit: is this trial still the key's canonical one?
                live = self._live(self._by_key().get(key, []))
                if not live or live[0]._trial_id != t._trial_id:
                    self._retire(t._trial_id, "duplicate")
                    continue
                return Claim(
                    key=key,
                    params=dict(t.user_attrs["params"]),
                    trial_id=t._trial_id,
                    attempt=int(t.user_attrs.get("attempt", 1)),
                )

    def _take(self, trial_id: int) -> bool:
        optuna = require_optuna()

        tries = []

        def go() -> bool:
            tries.append(1)
            try:
                return bool(
                    self._storage.set_trial_state_values(
                        trial_id, state=optuna.trial.TrialState.RUNNING
                    )
                )
            except optuna.exceptions.UpdateFinishedTrialError:
                return False

        taken = bool(self._retry(go, "claim"))
        if not taken and len(tries) > 1:
            # a retry found the trial taken: the first try may have been committed with its
            # answer lost (connection dropped). Such a RUNNING trial has no heartbeat, and
            # Optuna never calls a trial without one stale; one beat lets the stale check give
            # it back if it is nobody's (a beat on another worker's trial changes nothing)
            self._retry(lambda: self._storage.record_heartbeat(trial_id), "heartbeat")
        return taken

    def _retire(self, trial_id: int, why: str) -> None:
        optuna = require_optuna()
        self._retry(lambda: self._storage.set_trial_system_attr(trial_id, why, True), "mark")
        self._finish(trial_id, optuna.trial.TrialState.FAIL)

    def _finish(self, trial_id: int, state: Any, value: float | None = None) -> None:
        optuna = require_optuna()

        def go() -> None:
            with contextlib.suppress(optuna.exceptions.UpdateFinishedTrialError):
                self._storage.set_trial_state_values(
                    trial_id, state=state, values=None if value is None else [value]
                )

        self._retry(go, "finish")

    def complete(
        self, claim: Claim, record: Mapping[str, Any], *, objective: str = "r_auroc"
    ) -> None:
        """Store a finished run's record and mark it ``COMPLETE``.

        The trial's value is ``record[objective]`` (``-inf`` when missing or not finite), so
        Optuna tools can sort the runs.
        """
        optuna = require_optuna()
        rec = {**dict(record), "key": claim.key}
        v = rec.get(objective)
        value = float(v) if isinstance(v, (int, float)) and math.isfinite(float(v)) else -math.inf
        try:
            self._retry(
                lambda: self._storage.set_trial_user_attr(claim.trial_id, "record", rec), "record"
            )
        except optuna.exceptions.UpdateFinishedTrialError:
            # this worker missed its heartbeats long enough for another to fail the run as
            # stale; the run was enqueued again and will be redone, nothing to store here
            return
        self._finish(claim.trial_id, optuna.trial.TrialState.COMPLETE, value)

    def fail(self, claim: Claim, error: str | None = None, *, interrupted: bool = False) -> None:
        """Mark a claimed run ``FAIL`` with its ``error`` (or as ``interrupted``: given back,
        not counted as an attempt, enqueued again by the next :meth:`add_runs`)."""
        optuna = require_optuna()
        try:
            if error is not None:
                self._retry(
                    lambda: self._storage.set_trial_user_attr(claim.trial_id, "error", str(error)),
                    "error",
                )
            if interrupted:
                self._retry(
                    lambda: self._storage.set_trial_system_attr(
                        claim.trial_id, "interrupted", True
                    ),
                    "mark",
                )
        except optuna.exceptions.UpdateFinishedTrialError:
            return  # already failed as stale by another worker
        self._finish(claim.trial_id, optuna.trial.TrialState.FAIL)

    # ------------------------------------------------------------------ the worker loop
    def work(
        self,
        fn: RunFn,
        *,
        wait: bool = True,
        poll: float = 5.0,
        max_runs: int | None = None,
        on_done: OnDone | None = None,
    ) -> int:
        """Claim and execute runs until none is left; return how many this worker finished.

        Parameters
        ----------
        fn : callable
            ``fn(params) -> record``: executes one run. An exception is recorded as the run's
            error (``FAIL``; tried again up to ``max_attempts``) and the worker goes on.
        wait : bool
            When nothing is waiting but other workers still run, wait (``poll`` seconds at a
            time) for them: a crashed worker's run comes back after ``grace_period``.
        poll : float
            Seconds between looks while waiting.
        max_runs : int, optional
            Stop after this many runs.
        on_done : callable, optional
            ``on_done(claim, record, error)`` after each run (progress output).
        """
        done, looked = 0, -math.inf
        with _sigterm_as_interrupt():
            while max_runs is None or done < max_runs:
                # a look for stale runs reads every trial: one per heartbeat interval (a run
                # turns stale only after ``grace_period``), and one before concluding none is left
                fresh = time.monotonic() - looked >= self.heartbeat_interval
                if fresh:
                    self.fail_stale()
                    looked = time.monotonic()
                claim = self.claim()
                if claim is None and not fresh:
                    looked = -math.inf
                    continue
                if claim is None:
                    if wait and self.status()["running"] > 0:
                        time.sleep(poll)
                        continue
                    break
                try:
                    with _Heartbeat(self._storage, claim.trial_id, self.heartbeat_interval):
                        record = fn(dict(claim.params))
                except KeyboardInterrupt:
                    self.fail(claim, interrupted=True)
                    raise
                except Exception as exc:  # recorded, the sweep goes on
                    err = f"{type(exc).__name__}: {exc}"
                    self.fail(claim, err)
                    if on_done is not None:
                        on_done(claim, None, err)
                    done += 1
                    continue
                self.complete(claim, record)
                if on_done is not None:
                    on_done(claim, record, None)
                done += 1
        return done

    def tuning_study(self, name: str, *, sampler: Any = None) -> Any:
        """An Optuna study ``"tune:<sweep>:<name>"`` (maximise) in the same storage, for a
        hyper-parameter search whose trials several workers can share."""
        optuna = require_optuna()
        if not str(name).strip():
            raise ValueError("`name` must be a non-empty study name")
        return self._retry(
            lambda: optuna.create_study(
                study_name=f"tune:{self.sweep}:{name}",
                storage=self._storage,
                direction="maximize",
                sampler=sampler,
                load_if_exists=True,
            ),
            "create tuning study",
        )
