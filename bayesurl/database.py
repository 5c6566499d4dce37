"""The SQL database a sweep's runs live in, shared by worker processes: its URL checked and
shown without its password, its errors in one line, lock waits and lost connections retried,
SQLite opened in WAL mode with serialised transactions.

:class:`bayesurl.sweeps.storage.SweepStorage` keeps the runs there through Optuna; this
module is what concerns the database itself, whoever talks to it:

* **Secrets.** A URL may carry a database password: :func:`redact_url` is the form every
  message, progress line and results file shows, :func:`scrub` hides the password fields in
  a driver's message; the full URL is used to connect only.
* **One-line errors.** :func:`one_line` is the driver's own message; a database that is not
  one, is corrupted or stays locked, refuses the login or needs a driver that is not installed
  is a :class:`StorageError` naming it (:func:`check_url`, :func:`corrupted`,
  :func:`dialect_hint`), and the database is left untouched.
* **Waiting.** :func:`retry` retries lock contention and, for up to a timeout, a connection
  lost after the database first answered (:func:`probe`; a restart, the network down);
  :func:`engine_options` has lost connections replaced before use.
* **SQLite** between processes: :func:`enable_wal` (readers do not block the writer) and
  :func:`serialise_sqlite` (every transaction takes the write lock first).

SQLAlchemy (installed with Optuna, extra ``sweep``) is imported where it is used; this module
imports nothing of bayesurl, so a worker process loads it without torch.
"""

from __future__ import annotations

import contextlib
import difflib
import random
import re
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = [
    "LOCK_TIMEOUT",
    "StorageError",
    "check_url",
    "corrupted",
    "dialect_hint",
    "enable_wal",
    "engine_options",
    "one_line",
    "probe",
    "redact_url",
    "retry",
    "scrub",
    "serialise_sqlite",
]


def redact_url(url: str) -> str:
    """``url`` with its password shown as ``***`` (the form every message, progress line and
    results file shows: a storage URL may carry a database password).

    Examples
    --------
    >>> redact_url("postgresql+psycopg2://ann:secret@db-host:5432/bayesurl")
    'postgresql+psycopg2://ann:***@db-host:5432/bayesurl'
    >>> redact_url("sqlite:///results/sweep.db")
    'sqlite:///results/sweep.db'
    """
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    text = str(url)
    if _ats(text) > 1:  # an unencoded @ in the password: all of it up to the host's @
        return re.sub(r"(://[^:/@]*:)[^/]*@", r"\1***@", text, count=1)
    try:
        return make_url(text).render_as_string(hide_password=True)
    except (ArgumentError, ValueError):  # not parseable: hide whatever sits between : and @
        return re.sub(r"(://[^:/@]*:)[^@]*@", r"\1***@", text)


def _ats(url: str) -> int:
    """The number of ``@`` between ``://`` and the path: more than one means a password with
    an unencoded ``@``, which SQLAlchemy would split at the first one."""
    rest = str(url).split("://", 1)[-1]
    return rest.split("/", 1)[0].count("@")


#: the password field of a URL (``scheme://user:PASSWORD@``) inside a message
_URL_PASSWORD = re.compile(r"(://[^:/@\s]*:)([^@\s]+)(@)")
#: the password field of a connection string (``password=PASSWORD``)
_KEY_PASSWORD = re.compile(r"(\bpassword\s*=\s*)('[^']*'|\"[^\"]*\"|[^\s,;)]+)", re.IGNORECASE)


def scrub(text: str, url: str) -> str:
    """``text`` with ``url`` and every password *field* in it hidden.

    The field, never the password's text wherever it appears: a stock password equal to the
    user name or part of the dialect (``postgress://postgres:postgres@...``) would otherwise
    hide the very typo the message is about.
    """
    text = text.replace(str(url), redact_url(url))
    text = _URL_PASSWORD.sub(r"\1***\3", text)
    return _KEY_PASSWORD.sub(r"\1***", text)


#: the databases an Optuna storage runs on (SQLAlchemy dialect names)
_DIALECTS = ("sqlite", "postgresql", "mysql", "mariadb", "oracle", "mssql")


def dialect_hint(url: str) -> str:
    """``" (did you mean ...?)"`` for a URL whose database name is not a dialect, else ``""``."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        name = make_url(url).get_backend_name()
    except (ArgumentError, ValueError):
        return ""
    if name in _DIALECTS:
        return ""
    near = difflib.get_close_matches(name, _DIALECTS, n=1)
    return f" ({name!r} is no database SQLAlchemy knows" + (
        f"; did you mean {near[0]}://...?)" if near else f"; e.g. {', '.join(_DIALECTS)})"
    )


class StorageError(ValueError):
    """The sweep storage cannot be used: corrupted, not a database, or locked too long.

    The message is one line and names the storage; bayesurl never rewrites or deletes the
    storage after such an error, so every finished run recorded in it stays there.
    """


#: Seconds a storage call waits for another process's lock before :class:`StorageError`.
LOCK_TIMEOUT = 120.0


def one_line(exc: BaseException) -> str:
    """The driver's own message of a database error wrapped by SQLAlchemy and Optuna (the
    innermost cause), on one line."""
    seen = {id(exc)}
    while True:
        inner = getattr(exc, "orig", None) or exc.__cause__ or exc.__context__
        if inner is None or id(inner) in seen:
            break
        seen.add(id(inner))
        exc = inner
    return " ".join(str(exc).split("\n")[0].split())


def _locked(exc: BaseException) -> bool:
    text = one_line(exc).lower()
    return "locked" in text or "busy" in text or "could not serialize" in text


#: Driver messages of a lost or refused database connection (PostgreSQL restarted, network
#: down): a running sweep waits for the database to come back.
_DISCONNECTED = (
    "could not connect",
    "connection refused",
    "server closed the connection",
    "terminating connection",
    "the database system is",
    "connection already closed",
    "no connection to the server",
    "could not receive data",
    "could not send data",
    "ssl syscall",
    "timeout expired",
    "connection timed out",
    "could not translate host name",
    "network is unreachable",
    "no route to host",
    "connection reset",
    "cannot connect now",
)


def _disconnected(exc: BaseException) -> bool:
    if getattr(exc, "connection_invalidated", False):
        return True
    text = one_line(exc).lower()
    return "password authentication" not in text and any(m in text for m in _DISCONNECTED)


def _refused_login(exc: BaseException) -> bool:
    """The server answered but refused the connection: wrong password, unknown user or
    database, no ``pg_hba.conf`` entry (no use waiting)."""
    text = one_line(exc).lower()
    markers = (
        "password authentication failed",
        "no password supplied",
        "pg_hba.conf",
        "does not exist",
    )
    return "fatal:" in text and any(m in text for m in markers)


def _transient(exc: BaseException) -> bool:
    """Lock contention, or two workers creating the schema of a new storage at once (the
    loser's ``CREATE TABLE`` finds the winner's table): both pass when tried again."""
    return _locked(exc) or "already exists" in one_line(exc).lower()


def probe(url: str, connect_args: dict[str, Any]) -> None:
    """Open one connection to the database of ``url``, run ``SELECT 1`` and close it."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.pool import NullPool

    engine = create_engine(url, poolclass=NullPool, connect_args=connect_args)
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
    finally:
        engine.dispose()


def check_url(url: str) -> None:
    """Refuse a URL SQLAlchemy cannot read, or one with an unencoded ``@`` in its password
    (SQLAlchemy would split it at the first one), in one line without the password.

    Raises
    ------
    StorageError
        Naming the URL with its password hidden, and how to write it.
    """
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    shown = redact_url(url)
    if _ats(url) > 1:
        raise StorageError(
            f"`url` {shown!r} holds more than one '@' before the host: write an '@' of "
            "the user name or password as %40 (URL-encoded), or give the password as "
            "PGPASSWORD"
        )
    try:
        make_url(url)
    except (ArgumentError, ValueError) as exc:
        raise StorageError(
            f"`url` {shown!r} is not a SQLAlchemy URL "
            f"({scrub(one_line(exc), url)}), e.g. sqlite:///path/sweep.db or "
            "postgresql+psycopg2://user:password@host:5432/database"
        ) from None


def engine_options(url: str, lock_timeout: float = LOCK_TIMEOUT) -> dict[str, Any]:
    """SQLAlchemy ``create_engine`` keywords for ``url``: SQLite waits up to ``lock_timeout``
    (at most a minute) for another process's lock; a server's connections are checked before
    use (one dropped by a restart is replaced), psycopg2 gives up connecting after 10 s."""
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        return {"connect_args": {"timeout": min(60.0, lock_timeout)}}
    options: dict[str, Any] = {"pool_pre_ping": True}
    if parsed.get_driver_name() == "psycopg2":
        options["connect_args"] = {"connect_timeout": 10}
    return options


def retry(
    fn: Callable[[], Any],
    what: str,
    tries: int = 60,
    also: tuple[type[BaseException], ...] = (),
    wait: float = LOCK_TIMEOUT,
    url: str = "",
    reconnect: bool = True,
) -> Any:
    """Call ``fn``, retrying on lock contention (SQLite ``database is locked``, serialisation
    failures; plus the exception types ``also``, e.g. those a library wraps them in) with a
    short random back-off, for at most ``tries`` attempts and ``wait`` seconds; then, or on a
    corrupted database, raise :class:`StorageError` (one line naming ``url`` with its
    password hidden). A lost
    connection (the database restarted) is retried for ``wait`` seconds when ``reconnect``,
    else it is at once a :class:`StorageError`; so is a refused login. Other errors
    propagate."""
    from sqlalchemy.exc import OperationalError

    start = time.monotonic()
    i = 0
    while True:
        try:
            return fn()
        except (OperationalError, *also) as exc:
            spent = time.monotonic() - start
            if _refused_login(exc):
                raise StorageError(
                    f"sweep storage {redact_url(url)} refused the connection "
                    f"({scrub(one_line(exc), url)}): check the user, password and database "
                    "name of --storage"
                ) from exc
            if _disconnected(exc):
                if not reconnect or spent >= wait:
                    why = f"did not answer for {spent:.0f} s" if reconnect else "does not answer"
                    raise _unreachable(url, exc, why) from exc
                time.sleep(0.5 + random.random() * 0.5)
                continue
            i += 1
            if i >= tries or spent >= wait:
                if _locked(exc):
                    raise StorageError(
                        f"sweep storage {redact_url(url)} stayed locked by another process for "
                        f"{spent:.0f} s ({what}: {scrub(one_line(exc), url)}); its finished "
                        "runs are kept: run again once the other process ends"
                    ) from exc
                raise corrupted(url, exc) from exc
            if isinstance(exc, OperationalError) and not _transient(exc):
                raise corrupted(url, exc) from exc
            time.sleep(0.02 + random.random() * min(1.0, 0.05 * i))


def corrupted(url: str, exc: BaseException) -> StorageError:
    return StorageError(
        f"sweep storage {redact_url(url)} is unreadable ({scrub(one_line(exc), url)}); it was "
        "left untouched: restore it from a copy (or `sqlite3 FILE .recover` for SQLite) to keep "
        "its finished runs, or give another --storage / --out to start a new sweep"
    )


def _unreachable(url: str, exc: BaseException, why: str) -> StorageError:
    return StorageError(
        f"sweep storage {redact_url(url)} {why} ({scrub(one_line(exc), url)}); its finished "
        "runs are kept in the database: start the same command again once it answers"
    )


def enable_wal(url: str, timeout: float = 30.0) -> None:
    """Put a local SQLite file in WAL mode (readers do not block the writer); persistent.

    Raises :class:`sqlite3.DatabaseError` when the file is not a SQLite database."""
    prefix = "sqlite:///"
    if not url.startswith(prefix) or url == "sqlite:///:memory:":
        return
    path = url[len(prefix) :].split("?", 1)[0]
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    for _ in range(50):
        try:
            with contextlib.closing(sqlite3.connect(path, timeout=min(30.0, timeout))) as con:
                con.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError:
            time.sleep(0.05 + random.random() * 0.1)


def serialise_sqlite(engine: Any) -> None:
    """Open every SQLite transaction with ``BEGIN IMMEDIATE`` (SQLAlchemy's pysqlite recipe).

    The Python driver starts a transaction only at the first write, so Optuna's read-then-write
    ``WAITING -> RUNNING`` check would not be atomic between processes: two workers could both
    read ``WAITING`` and both claim the trial (the two-process test caught this). With
    ``BEGIN IMMEDIATE`` the write lock is taken before the read.
    """
    from sqlalchemy import event

    @event.listens_for(engine, "connect")
    def _no_driver_begin(dbapi_connection: Any, record: Any) -> None:
        dbapi_connection.isolation_level = None

    @event.listens_for(engine, "begin")
    def _begin_immediate(conn: Any) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")

    engine.dispose()  # drop connections opened before the listeners
