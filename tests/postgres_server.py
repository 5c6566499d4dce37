"""A throwaway PostgreSQL server for the tests (a pytest plugin: the ``postgres`` fixture).

The server is a fresh cluster (``initdb``) in a temporary folder, listening on 127.0.0.1 and a
free port only, with password (SCRAM) authentication for every connection so a wrong password
is refused for real. PostgreSQL refuses to run as root: under root (CI) it runs as the
``postgres`` system user (``runuser``). Each pytest process (each xdist worker) starts its own
server on first use, on its own port and folder, and stops and removes it at exit.

The binaries are looked up in ``$BAYESURL_PG_BIN``, ``/usr/lib/postgresql/*/bin`` and ``PATH``;
where they (or the psycopg2 driver) are absent, the tests that need the server skip and say
why.
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import os
import pwd
import secrets
import shlex
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

#: The marker of the tests that run against the throwaway server (listed after the run).
MARK = "postgres"


def find_bin() -> Path | None:
    """The folder holding ``initdb`` and ``pg_ctl``, or ``None``."""
    candidates = [os.environ.get("BAYESURL_PG_BIN", "")]
    candidates += sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)
    which = shutil.which("pg_ctl")
    candidates.append(str(Path(which).parent) if which else "")
    for c in candidates:
        if c and (Path(c) / "initdb").is_file() and (Path(c) / "pg_ctl").is_file():
            return Path(c)
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PostgresServer:
    """One throwaway cluster: :meth:`start`, :meth:`url`, :meth:`restart`, :meth:`stop`.

    ``password`` is the sentinel the no-secret-in-any-output test looks for.
    """

    user = "bayesurl"

    def __init__(self, bindir: Path) -> None:
        self.bindir = bindir
        self.password = "pw-" + secrets.token_hex(12)
        self.port = 0
        self.folder: Path | None = None
        self._n_db = 0
        self._as: list[str] = []
        self._uid: int | None = None
        if os.geteuid() == 0:  # initdb and postgres refuse root
            try:
                entry = pwd.getpwnam("postgres")
            except KeyError:
                raise RuntimeError(
                    "running as root and no `postgres` user to run PostgreSQL as"
                ) from None
            self._uid, self._gid = entry.pw_uid, entry.pw_gid
            self._as = ["runuser", "-u", "postgres", "--"]

    @property
    def data(self) -> Path:
        assert self.folder is not None
        return self.folder / "data"

    def _run(self, *args: str, timeout: float = 120) -> str:
        cmd = [*self._as, str(self.bindir / args[0]), *args[1:]]
        env = {**os.environ, "LC_ALL": "C", "PGTZ": "UTC"}
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=self.folder
        )
        if proc.returncode != 0:
            log = self.folder / "server.log" if self.folder else None
            tail = log.read_text()[-2000:] if log and log.exists() else ""
            raise RuntimeError(f"{' '.join(args[:1])} failed: {proc.stderr[-2000:]}\n{tail}")
        return proc.stdout

    def _chown(self, path: Path) -> None:
        if self._uid is not None:
            os.chown(path, self._uid, self._gid)

    def start(self) -> PostgresServer:
        """``initdb`` a new cluster and start it (a few seconds)."""
        base = tempfile.gettempdir()
        if self._uid is not None and not os.stat(base).st_mode & 0o001:
            base = "/tmp"  # the postgres user must reach the folder
        self.folder = Path(tempfile.mkdtemp(prefix="bayesurl-pg-", dir=base))
        self._chown(self.folder)
        pwfile = self.folder / "pw"
        pwfile.write_text(self.password + "\n")
        self._chown(pwfile)
        self._run(
            "initdb",
            "-D",
            str(self.data),
            "-U",
            self.user,
            f"--pwfile={pwfile}",
            "--auth=scram-sha-256",
            "--encoding=UTF8",
            "--no-sync",
        )
        pwfile.unlink()
        for attempt in range(3):  # another process may take the free port first
            self.port = _free_port()
            try:
                self._pg_start()
                break
            except RuntimeError:
                if attempt == 2:
                    raise
        atexit.register(self.stop)
        # a pytest killed by a signal runs no atexit: this shell stops the server after it
        stop = shlex.join(
            [*self._as, str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", "immediate",
             "stop"]
        )  # fmt: skip
        subprocess.Popen(
            ["sh", "-c", f"while kill -0 {os.getpid()}; do sleep 2; done; {stop}; "
             f"rm -rf {shlex.quote(str(self.folder))}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        return self

    def _pg_start(self) -> None:
        assert self.folder is not None
        self._run(
            "pg_ctl",
            "-D",
            str(self.data),
            "-l",  # the server's output goes to the log, not to this process's pipes
            str(self.folder / "server.log"),
            "-w",
            "-t",
            "60",
            "-o",
            f"-c listen_addresses=127.0.0.1 -p {self.port} "
            f"-c unix_socket_directories={self.folder} -c max_connections=300 "
            "-c fsync=off -c synchronous_commit=off -c full_page_writes=off",
            "start",
        )

    def restart(self, down: float = 0.0) -> None:
        """Stop (``-m fast``: every connection is dropped), wait ``down`` seconds, start
        again on the same port with the data kept (``pg_ctl restart`` would forget the log
        file and hold this process's pipes)."""
        self._run("pg_ctl", "-D", str(self.data), "-w", "-t", "60", "-m", "fast", "stop")
        time.sleep(down)
        self._pg_start()

    def stop(self) -> None:
        """Stop the server and remove its folder (idempotent)."""
        if self.folder is None or not self.folder.exists():
            return
        with contextlib.suppress(Exception):
            self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(self.folder, ignore_errors=True)

    def url(self, database: str = "postgres", password: str | None = None) -> str:
        """``postgresql+psycopg2://bayesurl:<password>@127.0.0.1:<port>/<database>``."""
        pw = self.password if password is None else password
        return f"postgresql+psycopg2://{self.user}:{pw}@127.0.0.1:{self.port}/{database}"

    def new_database(self) -> str:
        """A fresh empty database; returns its URL."""
        import psycopg2

        self._n_db += 1
        name = f"sweep_{os.getpid()}_{self._n_db}"
        con = psycopg2.connect(
            host="127.0.0.1",
            port=self.port,
            user=self.user,
            password=self.password,
            dbname="postgres",
        )
        try:
            con.autocommit = True
            with con.cursor() as cur:
                cur.execute(f'CREATE DATABASE "{name}"')
        finally:
            con.close()
        return self.url(name)

    def wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if (
                subprocess.run(
                    [str(self.bindir / "pg_isready"), "-h", "127.0.0.1", "-p", str(self.port)],
                    capture_output=True,
                ).returncode
                == 0
            ):
                return
            time.sleep(0.2)
        raise RuntimeError("PostgreSQL did not come back")


_SERVER: PostgresServer | None = None


@pytest.fixture(scope="session")
def postgres() -> PostgresServer:
    """The throwaway server of this pytest process (started on first use)."""
    global _SERVER
    bindir = find_bin()
    if bindir is None:
        pytest.skip("PostgreSQL binaries (initdb, pg_ctl) not found: set BAYESURL_PG_BIN")
    pytest.importorskip("psycopg2", reason="psycopg2 missing: pip install 'bayesurl[postgres]'")
    if _SERVER is None:
        _SERVER = PostgresServer(bindir).start()
    yield _SERVER
    _SERVER.stop()
    _SERVER = None


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:  # noqa: ARG001
    """Name the PostgreSQL tests and their outcome, so a CI log shows they ran."""
    seen: dict[str, str] = {}
    for outcome in ("passed", "failed", "skipped", "error"):
        for rep in terminalreporter.stats.get(outcome, []):
            if MARK in getattr(rep, "keywords", {}) and getattr(rep, "when", "call") in (
                "call",
                "setup",
            ):
                if rep.when == "call" or outcome != "passed":
                    seen[rep.nodeid] = outcome
    if not seen:
        return
    counts: dict[str, int] = {}
    for v in seen.values():
        counts[v] = counts.get(v, 0) + 1
    terminalreporter.write_sep("-", "PostgreSQL tests (throwaway server)")
    for nodeid, outcome in sorted(seen.items()):
        terminalreporter.write_line(f"{outcome.upper():8s} {nodeid}")
    terminalreporter.write_line(", ".join(f"{n} {k}" for k, n in sorted(counts.items())))
