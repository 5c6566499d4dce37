"""Crash-safe files: atomic writes survive a SIGKILL, sealed caches refuse altered data."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time

import numpy as np
import pytest
import torch
from torch import nn

from bayesurl.files import (
    CorruptedFileError,
    atomic_open,
    atomic_write,
    file_record,
    reuse_or_build,
    seal,
    unseal,
    write_json,
)
from bayesurl.posthoc import EmbeddingCache


def test_file_record_matches_hashlib(tmp_path):
    data = os.urandom(5_000_003)
    (tmp_path / "f").write_bytes(data)
    assert file_record(tmp_path / "f") == {
        "bytes": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
    }


def test_atomic_write_replaces_and_failure_keeps_old(tmp_path):
    p = tmp_path / "sub" / "r.json"
    write_json(p, {"a": 1})
    assert json.loads(p.read_text()) == {"a": 1}
    with pytest.raises(RuntimeError), atomic_open(p) as fh:
        fh.write('{"a": ')
        raise RuntimeError("killed mid-write")
    assert json.loads(p.read_text()) == {"a": 1}
    assert [f.name for f in p.parent.iterdir()] == ["r.json"]  # no temporary left behind
    atomic_write(p, b"xyz")
    assert p.read_bytes() == b"xyz"
    with pytest.raises(ValueError, match="`mode`"), atomic_open(p, "a"):
        pass


_WRITER = textwrap.dedent(
    """
    import sys, time
    from bayesurl.files import atomic_open
    with atomic_open(sys.argv[1]) as fh:
        fh.write("{" + '"x": 1, ' * 100000)
        fh.flush()
        print("writing", flush=True)
        time.sleep(60)
        fh.write('"end": 0}')
    """
)


def test_sigkill_during_write_leaves_previous_file_readable(tmp_path):
    p = tmp_path / "results.json"
    write_json(p, {"runs": [1, 2, 3]})
    proc = subprocess.Popen(
        [sys.executable, "-c", _WRITER, str(p)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout.readline().strip() == "writing"  # half the new file is on disk
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL
    assert json.loads(p.read_text()) == {"runs": [1, 2, 3]}
    # the orphaned temporary is hidden and never mistaken for the results
    leftovers = [f.name for f in tmp_path.iterdir() if f.name != "results.json"]
    assert all(n.startswith(".results.json.") and n.endswith(".tmp") for n in leftovers)


def _sealed(tmp_path):
    (tmp_path / "a.bin").write_bytes(b"0123456789")
    seal(tmp_path, {"k": 1}, ["a.bin"])
    return tmp_path


def test_unseal_refuses_truncated_altered_missing_and_garbled(tmp_path):
    folder = _sealed(tmp_path)
    assert unseal(folder)["k"] == 1
    (folder / "a.bin").write_bytes(b"0123456788")  # same size, one byte changed
    with pytest.raises(CorruptedFileError, match="SHA-256"):
        unseal(folder)
    assert unseal(folder, checksum=False)["k"] == 1  # the size still matches
    (folder / "a.bin").write_bytes(b"01234")
    with pytest.raises(CorruptedFileError, match="5 bytes.*recorded 10.*truncated"):
        unseal(folder, checksum=False)
    (folder / "a.bin").unlink()
    with pytest.raises(CorruptedFileError, match="missing"):
        unseal(folder)
    (folder / "meta.json").write_text('{"k": ')
    with pytest.raises(CorruptedFileError, match="meta.json.*corrupted"):
        unseal(folder)
    with pytest.raises(FileNotFoundError, match="no sealed cache"):
        unseal(tmp_path / "none")


def test_reuse_or_build_reuses_verified_rebuilds_corrupted_and_foreign(tmp_path):
    calls = []

    def build(folder):
        calls.append(1)
        np.arange(100, dtype=np.float32).tofile(folder / "x.bin")
        return {"files": ["x.bin"], "meta": {"n": 100}}

    meta = reuse_or_build(tmp_path / "c", build, key={"weights": "abc"})
    assert meta["n"] == 100 and len(calls) == 1
    reuse_or_build(tmp_path / "c", build, key={"weights": "abc"})
    assert len(calls) == 1  # verified, reused
    with open(tmp_path / "c" / "x.bin", "r+b") as f:
        f.truncate(40)
    with pytest.warns(UserWarning, match="rebuilding the cache.*truncated"):
        reuse_or_build(tmp_path / "c", build, key={"weights": "abc"})
    assert len(calls) == 2
    assert np.fromfile(tmp_path / "c" / "x.bin", dtype=np.float32).size == 100
    reuse_or_build(tmp_path / "c", build, key={"weights": "other"})
    assert len(calls) == 3  # another key: rebuilt


def test_embedding_cache_refuses_altered_bytes_of_the_same_size(tmp_path):
    enc = nn.Linear(3, 2)
    EmbeddingCache.build(enc, [(torch.randn(4, 3), torch.arange(4))], tmp_path, progress=False)
    raw = bytearray((tmp_path / "features.npy").read_bytes())
    raw[-1] ^= 0xFF  # a value, not the header
    (tmp_path / "features.npy").write_bytes(bytes(raw))
    with pytest.raises(ValueError, match="SHA-256.*rebuild"):
        EmbeddingCache(tmp_path)
    assert EmbeddingCache(tmp_path, verify=False).n_items == 4  # sizes alone cannot tell


def test_embedding_cache_killed_while_building_is_never_opened(tmp_path):
    script = textwrap.dedent(
        """
        import sys, time, torch
        from torch import nn
        from bayesurl.posthoc import EmbeddingCache

        def loader():
            yield torch.randn(8, 3), torch.arange(8)
            print("half", flush=True)
            time.sleep(60)
            yield torch.randn(8, 3), torch.arange(8)

        EmbeddingCache.build(
            nn.Linear(3, 2), loader(), sys.argv[1], progress=False, overwrite=True
        )
        """
    )
    enc = nn.Linear(3, 2)
    EmbeddingCache.build(enc, [(torch.randn(4, 3), torch.arange(4))], tmp_path, progress=False)
    proc = subprocess.Popen(
        [sys.executable, "-c", script, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout.readline().strip() == "half"
        time.sleep(0.2)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stdout.close()
    # the rebuild removed the old index first, so neither the old nor the half cache opens
    with pytest.raises(FileNotFoundError, match="meta.json missing"):
        EmbeddingCache(tmp_path)


def test_unwritable_places_fail_before_touching_the_old_file(tmp_path):
    p = tmp_path / "r.json"
    write_json(p, {"a": 1})
    (tmp_path / "file").write_text("x")
    with pytest.raises(OSError):  # a parent that is a file: nothing to write into
        atomic_write(tmp_path / "file" / "r.json", "{}")


_READONLY = textwrap.dedent(
    """
    import os, sys
    from bayesurl.files import write_json
    if os.geteuid() == 0:  # root writes anywhere: drop to nobody for a real read-only folder
        os.setgid(65534)
        os.setuid(65534)
    try:
        write_json(sys.argv[1], {"a": 2})
    except PermissionError as exc:
        print("refused", exc.filename == sys.argv[1] or "")
    """
)


def test_read_only_folder_refuses_and_keeps_the_previous_results():
    folder = tempfile.mkdtemp(prefix="bayesurl-ro-")  # outside pytest's root-only tmp tree
    try:
        path = os.path.join(folder, "results.json")
        write_json(path, {"a": 1})
        os.chmod(path, 0o644)
        os.chmod(folder, 0o555)
        run = subprocess.run(
            [sys.executable, "-c", _READONLY, path], capture_output=True, text=True, timeout=120
        )
        assert run.stdout.startswith("refused"), run.stderr
        assert json.loads(open(path).read()) == {"a": 1}
        assert sorted(os.listdir(folder)) == ["results.json"]
    finally:
        os.chmod(folder, 0o755)
        shutil.rmtree(folder)


def test_reuse_or_build_is_safe_when_processes_build_the_same_cache_at_once(tmp_path):
    """Two builders of one cache at the same time (two workers of a sweep extracting the same
    split's features): each writes its own folder; one is put in place, the other builder
    reads it, and no file of the cache is ever half written or missing."""
    import threading

    both = threading.Barrier(2)
    calls, results, errors = [], [], []

    def build(folder):
        calls.append(folder)
        both.wait(timeout=30)  # both are building now
        np.arange(100, dtype=np.float32).tofile(folder / "x.bin")
        (folder / "labels.npy").write_bytes(b"x")
        (folder / "labels.npy").unlink()  # as write_shard removes an unused file
        return {"files": ["x.bin"], "meta": {"n": 100}}

    def go():
        try:
            results.append(reuse_or_build(tmp_path / "c", build, key={"weights": "abc"}))
        except Exception as exc:  # noqa: BLE001 - collected for the assertion
            errors.append(exc)

    threads = [threading.Thread(target=go) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert errors == [] and len(calls) == 2 and calls[0] != calls[1]
    assert results[0]["files"] == results[1]["files"]
    assert unseal(tmp_path / "c")["n"] == 100
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c"]  # no builder's folder left


@pytest.mark.skipif(os.name != "posix", reason="POSIX permission bits")
@pytest.mark.parametrize("mask", [0o022, 0o027, 0o077, 0o002], ids=oct)
def test_atomic_writes_follow_the_umask_like_a_plain_open(tmp_path, mask):
    """results.json, a results CSV, a checkpoint and a plot of one folder get the mode a
    plain ``open`` gives a new file under the same umask (the temporary file alone is 0600)."""
    from bayesurl.sweeps.report import write_results
    from bayesurl.training.checkpoint import save_checkpoint

    old = os.umask(mask)
    try:
        with open(tmp_path / "plain.txt", "w") as fh:  # the reference: what open() gives
            fh.write("x")
        atomic_write(tmp_path / "a.txt", "x")
        write_json(tmp_path / "b.json", {"a": 1})
        save_checkpoint({"state_dict": {"w": torch.zeros(2)}}, tmp_path / "c.pt")
        rec = {"method": "ce", "split": 0, "seed": 0, "error": None, "r@1": 0.8,
               "r_auroc": 0.5, "loss_curve": [2.0, 1.0]}  # fmt: skip
        write_results([rec], tmp_path / "sweep", {"preset": "t"})
    finally:
        os.umask(old)
    want = (tmp_path / "plain.txt").stat().st_mode & 0o777
    assert want == 0o666 & ~mask
    files = [tmp_path / n for n in ("a.txt", "b.json", "c.pt")]
    files += sorted((tmp_path / "sweep").iterdir())
    assert {f.name for f in files} >= {"results.json", "results.csv", "training_curves.png"}
    for f in files:
        assert f.stat().st_mode & 0o777 == want, (f.name, oct(f.stat().st_mode & 0o777))


def test_save_figure_writes_a_palette_png_smaller_than_matplotlibs(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from PIL import Image

    from bayesurl.files import save_figure

    fig, ax = plt.subplots()
    for k in range(8):
        ax.plot(range(50), [((i * (k + 1)) % 17) / 17 for i in range(50)], label=f"curve {k}")
    ax.legend()
    fig.savefig(tmp_path / "plain.png", dpi=100)
    path = save_figure(fig, tmp_path / "small.png", dpi=100)
    plt.close(fig)
    assert path == tmp_path / "small.png"
    with Image.open(path) as im, Image.open(tmp_path / "plain.png") as ref:
        assert im.mode == "P" and im.size == ref.size
        # the picture is kept: each pixel within a few levels of matplotlib's own
        a = np.asarray(im.convert("RGB"), dtype=np.int16)
        b = np.asarray(ref.convert("RGB"), dtype=np.int16)
        assert np.abs(a - b).mean() < 2.0
    assert path.stat().st_size < (tmp_path / "plain.png").stat().st_size
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
