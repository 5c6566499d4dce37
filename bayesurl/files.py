"""Crash-safe files: atomic writes and verified reuse of cached files.

Every results file, manifest and cache index of bayesurl is written through :func:`atomic_write`
(or :func:`atomic_open` / :func:`write_json`): the bytes go to a temporary file in the same
folder, are flushed to disk, and :func:`os.replace` puts them in place in one step. A process
killed while writing leaves the previous version readable (or no file), never half a file.

A cache folder is *sealed* by :func:`seal`: its index (``meta.json``) records the size and
SHA-256 of each data file and is written last, atomically, so it exists only once the data is
complete. :func:`unseal` checks both before the cache is reused and raises
:class:`CorruptedFileError` on any difference; :func:`reuse_or_build` rebuilds such a cache
instead of reading it (a truncated or altered cache is never silently used).
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import io
import json
import math
import os
import shutil
import tempfile
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import IO, Any

from PIL import Image

__all__ = [
    "CorruptedFileError",
    "FormatError",
    "atomic_open",
    "atomic_write",
    "check_format",
    "file_record",
    "format_of",
    "jsonable",
    "read_json_document",
    "read_json_gz",
    "reuse_or_build",
    "save_figure",
    "seal",
    "unseal",
    "write_json",
    "write_json_gz",
]

#: Read size of :func:`file_record` (the checksum streams the file; memory stays constant).
_CHUNK = 1 << 22


class CorruptedFileError(ValueError):
    """A file that is missing, truncated or altered since it was recorded."""


def _umask() -> int:
    """The process's file-mode creation mask.

    Read from ``/proc/self/status`` where the kernel gives it (Linux 4.7 and later), which
    changes nothing. Elsewhere :func:`os.umask` must set a mask to return the old one: it is
    set to the most restrictive ``0o077`` for that instant, so a file another thread creates
    in between is at worst private, never more open than asked.
    """
    with contextlib.suppress(OSError, ValueError):
        with open("/proc/self/status", encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    old = os.umask(0o077)
    os.umask(old)
    return old


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike[str], mode: str = "w", **kwargs: Any) -> Iterator[IO[Any]]:
    """Open a temporary file beside ``path``; on a clean exit it replaces ``path`` atomically.

    On an exception (or a kill) the temporary file is removed (or left as a hidden
    ``.name.*.tmp`` file) and ``path`` keeps its previous content. Missing parent folders are
    created. The file gets the permissions :func:`open` gives a new file, ``0o666`` less the
    umask (the temporary file is created private, ``0o600``, and opened up to that before it
    takes ``path``'s place).

    Parameters
    ----------
    path : path-like
        The final file.
    mode : {"w", "wb"}
        Text or binary; other keyword arguments go to :func:`open` (``newline=""`` for csv).
    """
    if mode not in ("w", "wb"):
        raise ValueError(f"`mode` must be 'w' or 'wb', got {mode!r}")
    path = Path(os.fspath(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.chmod(tmp, 0o666 & ~_umask())
        with os.fdopen(fd, mode, **kwargs) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def atomic_write(path: str | os.PathLike[str], data: str | bytes) -> Path:
    """Write ``data`` (text or bytes) to ``path`` atomically; returns ``path`` as a Path."""
    with atomic_open(path, "wb" if isinstance(data, bytes) else "w") as fh:
        fh.write(data)
    return Path(os.fspath(path))


def save_figure(fig: Any, path: str | os.PathLike[str], *, dpi: int = 120) -> Path:
    """A matplotlib figure written atomically to ``path`` as a PNG of at most 256 colours.

    The plots of a benchmark (lines, markers, text on white) hold a few dozen colours, so an
    adaptive palette keeps them as they look while the file is about a third of the size of
    matplotlib's RGBA output: the committed result folders stay small.
    """
    raw = io.BytesIO()
    fig.savefig(raw, format="png", dpi=dpi)
    raw.seek(0)
    with Image.open(raw) as im:
        small = im.convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT)
    out = io.BytesIO()
    small.save(out, format="PNG", optimize=True)
    return atomic_write(path, out.getvalue())


def write_json(path: str | os.PathLike[str], obj: Any, **dumps: Any) -> Path:
    """``json.dumps(obj, **dumps)`` written atomically to ``path`` (``indent=2`` by default)."""
    dumps.setdefault("indent", 2)
    return atomic_write(path, json.dumps(obj, **dumps))


def jsonable(obj: Any) -> Any:
    """``obj`` ready for JSON: mappings and sequences walked (keys as text), non-finite
    floats as ``None``, NumPy arrays, NumPy scalars and tensors as Python's lists and numbers
    (``tolist``), other numbers as ``float``, anything else as its text.

    The one clean-up every results file of bayesurl goes through, so that a metric that is
    undefined is written as ``null`` (JSON has no NaN) and a value of an unknown type never
    stops a write.
    """
    if isinstance(obj, Mapping):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if obj is None or isinstance(obj, (int, str, bool)):
        return obj
    if hasattr(obj, "tolist"):  # a NumPy array or scalar, a tensor: Python's own numbers
        return jsonable(obj.tolist())
    try:
        f = float(obj)
        return f if math.isfinite(f) else None
    except (TypeError, ValueError):
        return str(obj)


def write_json_gz(path: str | os.PathLike[str], obj: Any) -> Path:
    """``obj`` as compact JSON, gzip-compressed, written atomically to ``path``.

    The archive carries no file name or time stamp, so the same ``obj`` gives the same bytes.
    """
    text = json.dumps(obj, separators=(",", ":")).encode()
    return atomic_write(path, gzip.compress(text, compresslevel=9, mtime=0))


def read_json_gz(path: str | os.PathLike[str]) -> Any:
    """The JSON document of a file :func:`write_json_gz` wrote.

    Raises
    ------
    ValueError
        If the file is not gzip-compressed JSON (the message names the file).
    """
    try:
        return json.loads(gzip.decompress(Path(path).read_bytes()))
    except (OSError, EOFError, ValueError) as exc:
        raise ValueError(f"{str(path)!r} is not gzip-compressed JSON: {exc}") from None


def file_record(path: str | os.PathLike[str]) -> dict[str, Any]:
    """``{"bytes": size, "sha256": hex digest}`` of a file (streamed, constant memory)."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(_CHUNK), b""):
            h.update(chunk)
    return {"bytes": os.path.getsize(path), "sha256": h.hexdigest()}


def seal(
    directory: str | os.PathLike[str],
    meta: Mapping[str, Any],
    files: Iterable[str],
    *,
    index: str = "meta.json",
) -> dict[str, Any]:
    """Record ``files`` (names inside ``directory``) in ``meta`` and write the index atomically.

    Call it after the data files are complete and closed: the index is the cache's commit mark.
    Returns the written index (``meta`` plus ``"files": {name: file_record}``).
    """
    folder = Path(os.fspath(directory))
    doc = {**dict(meta), "files": {n: file_record(folder / n) for n in files}}
    write_json(folder / index, doc, indent=1)
    return doc


def unseal(
    directory: str | os.PathLike[str], *, index: str = "meta.json", checksum: bool = True
) -> dict[str, Any]:
    """Read a sealed folder's index and check every recorded file; returns the index.

    Raises
    ------
    FileNotFoundError
        If the folder has no index (nothing was sealed there).
    CorruptedFileError
        If the index is unreadable, lacks its file records, or a recorded file is missing, of
        another size, or (with ``checksum``) of another SHA-256 -- a truncated or altered cache.
    """
    folder = Path(os.fspath(directory))
    path = folder / index
    if not path.is_file():
        raise FileNotFoundError(f"no sealed cache in {str(folder)!r} ({index} missing)")
    try:
        meta = json.loads(path.read_text())
        records = meta["files"]
        if not isinstance(records, dict):
            raise TypeError("'files' is not a mapping")
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
        raise CorruptedFileError(f"{str(path)!r} is corrupted ({exc})") from None
    for name, want in records.items():
        p = folder / name
        if not p.is_file():
            raise CorruptedFileError(f"{str(p)!r} is missing (recorded in {index})")
        size = p.stat().st_size
        if size != want.get("bytes"):
            raise CorruptedFileError(
                f"{str(p)!r} has {size} bytes, {index} recorded {want.get('bytes')} (truncated)"
            )
        if checksum and file_record(p)["sha256"] != want.get("sha256"):
            raise CorruptedFileError(
                f"{str(p)!r} differs from its SHA-256 recorded in {index} (corrupted)"
            )
    return meta


def reuse_or_build(
    directory: str | os.PathLike[str],
    build: Callable[[Path], Mapping[str, Any]],
    *,
    key: Mapping[str, Any],
    index: str = "meta.json",
) -> dict[str, Any]:
    """Return the index of a verified cache in ``directory`` built for ``key``; else rebuild it.

    ``build(directory)`` writes the data files and returns ``{"files": [names], "meta": {...}}``
    (``meta`` optional), which :func:`seal` records; ``key`` (for example the weights
    fingerprint, data and transform; JSON-able) is stored in the index and must match for reuse.
    A missing, truncated, altered or foreign cache is rebuilt (a corrupted one with a
    :class:`UserWarning` saying why), never read.

    Safe for several processes building the same cache at once: each builds into a hidden
    folder of its own beside ``directory`` and renames it into place when sealed; a process
    that finds the place taken by a verified cache of the same key (built meanwhile by
    another) uses that one and removes its own.
    """
    folder = Path(os.fspath(directory))
    want = json.loads(json.dumps(dict(key), default=str))
    found = _verified(folder, want, index, warn=True)
    if found is not None:
        return found
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = folder.with_name(f".{folder.name}.{os.getpid()}.{time.monotonic_ns()}.tmp")
    tmp.mkdir()  # (mkdir follows the umask, as the files of the cache do)
    try:
        built = build(tmp)
        meta = seal(tmp, {**dict(built.get("meta", {})), "key": want}, built["files"], index=index)
        for _ in range(3):
            try:
                os.rename(tmp, folder)
                return meta
            except OSError:  # the place is taken: by a cache another process just built?
                other = _verified(folder, want, index, warn=False)
                if other is not None:
                    return other
                _set_aside(folder)  # an old, corrupted or foreign cache
        raise OSError(f"cannot put the cache {str(folder)!r} in place")
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _verified(folder: Path, key: Any, index: str, *, warn: bool) -> dict[str, Any] | None:
    """The index of a verified cache in ``folder`` built for ``key``, else ``None``."""
    try:
        meta = unseal(folder, index=index)
    except FileNotFoundError:
        return None
    except CorruptedFileError as exc:
        if warn:
            warnings.warn(f"rebuilding the cache: {exc}", UserWarning, stacklevel=3)
        return None
    return meta if meta.get("key") == key else None


def _set_aside(folder: Path) -> None:
    """Move a cache folder out of the way (and delete it); gone already is fine."""
    aside = folder.with_name(f".{folder.name}.{os.getpid()}.{time.monotonic_ns()}.old")
    try:
        os.rename(folder, aside)
    except FileNotFoundError:
        return
    shutil.rmtree(aside, ignore_errors=True)


# --------------------------------------------------------------------------------------------
# result documents: a format name and version in every file a reader may meet again


class FormatError(ValueError):
    """A result file of another kind, or written by a newer bayesurl than this one reads."""


def format_of(name: str, version: int) -> str:
    """The format tag ``"<name>/<version>"`` a result document records in ``"format"``."""
    return f"{name}/{int(version)}"


def check_format(doc: Any, path: str | os.PathLike[str], expected: str) -> int | None:
    """Refuse a document whose ``"format"`` this bayesurl does not read; its version.

    ``expected`` is the tag this bayesurl writes (``"bayesurl.results/1"``). A document of
    that format at a version up to it passes (the version is returned); one without a
    ``"format"`` entry was written before result files carried one and passes with ``None``
    (the reader then checks its layout itself). Anything else raises :class:`FormatError` in
    one line naming ``path``, the format found and the one read here.
    """
    name, _, top = expected.rpartition("/")
    where = str(os.fspath(path))
    if not isinstance(doc, dict):
        raise FormatError(f"{where!r} does not hold a JSON object (this bayesurl reads {expected})")
    found = doc.get("format")
    if found is None:
        return None
    text = str(found)
    kind, _, version = text.rpartition("/")
    if kind != name or not version.isdigit():
        raise FormatError(
            f"{where!r} is of format {text!r}, not a {name} file (this bayesurl reads {expected})"
        )
    if int(version) > int(top):
        raise FormatError(
            f"{where!r} was written by a newer bayesurl (format {text}); this one reads "
            f"{expected}: upgrade bayesurl to read it"
        )
    return int(version)


def read_json_document(path: str | os.PathLike[str], expected: str) -> dict[str, Any]:
    """Read a JSON result file and check its format (:func:`check_format`); one-line errors.

    Raises
    ------
    FileNotFoundError
        If ``path`` does not exist.
    FormatError
        If the file is not JSON (truncated, binary, another kind of file), not an object, or
        of another format or a newer version; naming ``path``.
    """
    p = Path(os.fspath(path))
    if not p.is_file():
        raise FileNotFoundError(f"{str(p)!r} does not exist")
    try:
        doc = json.loads(p.read_bytes().decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        first = " ".join(str(exc).split())
        raise FormatError(
            f"{str(p)!r} is not a readable JSON file ({first}; truncated or not a {expected} file)"
        ) from None
    check_format(doc, p, expected)
    return doc
