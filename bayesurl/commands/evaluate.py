"""Evaluate embeddings and uncertainties stored in an .npz file, or a trained checkpoint.

``bayesurl evaluate --checkpoint CKPT [--dataset NAME]`` rebuilds a method trained by
``bayesurl train`` (weights-only load) and evaluates it zero-shot on the downstream classes of
its data set, with OOD AUROC against held-out upstream data
(:func:`bayesurl.runs.runner.evaluate_checkpoint`; URL benchmark section 3.2).

Under ``torchrun --nproc_per_node W`` the evaluation is sharded: with INPUT.npz each
rank reads its rows, with ``--checkpoint`` each rank embeds its block of batches of each set
(:func:`bayesurl.runs.predict.score`); the exact search passes the shards between the ranks
and every rank gets the single-process metrics; rank 0 prints and writes ``--json``.

INPUT.npz holds ``embeddings`` [N,D] and ``labels`` [N], and optionally ``uncertainties`` [N],
``samples`` [S,N,D] and ``ood_uncertainties`` [M]. Prints a table of every metric; with
``--json`` writes the metrics (null where undefined for the input). Metric definitions:
docs/concepts/metrics.rst (URL benchmark section 3.1, LAM section 5).
"""

from __future__ import annotations

import argparse
import math
import os
import struct
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bayesurl._checks import check_input_file, check_int, check_ints, resolve_device
from bayesurl.distributed import launched_by_torchrun
from bayesurl.files import write_json

HELP = "evaluate embeddings / uncertainties / samples from an .npz file, or a checkpoint"

#: output options checked by ``bayesurl.cli`` while parsing (before any work)
OUTPUT_FILES = ("json",)

#: Arrays read from INPUT.npz (name -> required).
ARRAYS = {
    "embeddings": True,
    "labels": True,
    "uncertainties": False,
    "samples": False,
    "ood_uncertainties": False,
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``bayesurl evaluate`` (INPUT is optional so other sources can be added)."""
    parser.add_argument("input", nargs="?", metavar="INPUT.npz", help="arrays to evaluate")
    parser.add_argument("--json", metavar="OUT.json", help="write the metrics as JSON")
    parser.add_argument(
        "--ks", type=int, nargs="+", default=[1, 5, 10], help="Recall@k / mAP@k cut-offs"
    )
    parser.add_argument(
        "--ece-mode",
        choices=["shortlist", "exact"],
        default="shortlist",
        help="per-draw 1-NN search of the ECE (default: shortlist)",
    )
    parser.add_argument(
        "--shortlist",
        type=int,
        default=None,
        help="shortlist length L (default: adaptive, estimated miss rate <= 1e-3)",
    )
    parser.add_argument("--device", default="cpu", help="torch device (default: cpu)")
    parser.add_argument(
        "--nproc-per-node",
        type=int,
        default=1,
        metavar="W",
        help="shard the evaluation over W processes on this machine, as "
        "`torchrun --standalone --nproc_per_node W` would run it but without torchrun's "
        "launcher: forked after the imports on CPU, spawned on CUDA (default: 1; threads "
        "per rank: OMP_NUM_THREADS, else the cores / W)",
    )
    ckpt = parser.add_argument_group("trained checkpoint (instead of INPUT.npz)")
    ckpt.add_argument(
        "--checkpoint", metavar="CKPT", help="a method checkpoint (last.pt of bayesurl train)"
    )
    ckpt.add_argument(
        "--dataset",
        default=None,
        help="default, fashion_mnist or digits (default: the one in train.json next to CKPT)",
    )
    ckpt.add_argument("--root", default=None, help="FashionMNIST folder (default: system path)")
    ckpt.add_argument(
        "--n-samples",
        type=int,
        default=None,
        help="draws for the ECE of methods with a distribution (default: 10)",
    )
    ckpt.add_argument("--max-test", type=int, default=None, help="cap on the test sets")
    ckpt.add_argument("--max-ood", type=int, default=None, help="cap on the OOD set")


def _not_an_archive(p: Path) -> ValueError | None:
    """The error for a file that is no ``.npz`` archive at all (``None`` when it starts like
    one): numpy would try it as a pickle and advise an unsafe load."""
    with open(p, "rb") as fh:
        head = fh.read(6)
    if head.startswith((b"PK\x03\x04", b"PK\x05\x06")):  # a zip archive, as numpy tells
        return None
    what = "a single .npy array" if head == b"\x93NUMPY" else "not an .npz archive"
    return ValueError(
        f"{p.name}: {what}; INPUT must be an .npz archive of named arrays "
        f"({', '.join(ARRAYS)}), as numpy.savez writes"
    )


def _check_names(p: Path, names: set[str]) -> set[str]:
    """``names``, the arrays of INPUT.npz ``p``, once every required one is there and none is
    unknown (e.g. ``uncertainty`` for ``uncertainties``: never ignored silently)."""
    missing = [k for k, req in ARRAYS.items() if req and k not in names]
    if missing:
        raise ValueError(f"{p.name}: missing array(s) {missing}; found {sorted(names)}")
    unknown = sorted(names - set(ARRAYS))
    if unknown:
        raise ValueError(
            f"{p.name}: unknown array(s) {unknown}; the known names are {', '.join(ARRAYS)}"
        )
    return names


def load_npz(path: str | Path) -> dict[str, np.ndarray]:
    """Read the known arrays of INPUT.npz; raise naming the file or the array on problems."""
    p = check_input_file(path, "INPUT")
    error = _not_an_archive(p)
    if error is not None:
        raise error
    try:
        f = np.load(p, allow_pickle=False)
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as exc:
        raise ValueError(f"{p.name}: not a readable .npz archive ({exc})") from exc
    if not isinstance(f, np.lib.npyio.NpzFile):
        raise ValueError(f"{p.name}: expected an .npz archive of named arrays, got one array")
    with f:
        names = _check_names(p, set(f.files))
        out = {}
        for k in ARRAYS:
            if k in names:
                try:
                    out[k] = np.asarray(f[k])
                except (ValueError, OSError, zipfile.BadZipFile) as exc:
                    raise ValueError(f"{p.name}: array `{k}` cannot be read ({exc})") from exc
        return out


#: Axis of the N rows in each array (``samples`` is ``[S, N, D]``); ``ood_uncertainties`` is
#: split over the ranks on its own length.
_ROW_AXIS = {"embeddings": 0, "labels": 0, "uncertainties": 0, "samples": 1}


def load_npz_shard(
    path: str | Path, rank: int | None = None, world_size: int | None = None
) -> dict[str, np.ndarray]:
    """This rank's contiguous rows of every array of INPUT.npz (sharded evaluation).

    Rank ``r`` of ``W`` reads rows :func:`bayesurl.distributed.shard_range` ``(N, r, W)`` of
    ``embeddings``, ``labels``, ``uncertainties`` and ``samples`` (along its N axis) and its
    share of ``ood_uncertainties``. Arrays stored uncompressed (``numpy.savez``) are read in
    place from the archive (``S`` strided reads for ``samples``), so no rank loads all ``N x D``;
    compressed members (``numpy.savez_compressed``) are decompressed whole and sliced.

    Parameters
    ----------
    path : str or Path
        INPUT.npz.
    rank, world_size : int, optional
        Default: this process's rank and the world size of the default process group.

    Returns
    -------
    dict
        The arrays' row slices.
    """
    from bayesurl.distributed import get_rank, get_world_size, shard_range

    rank = get_rank() if rank is None else rank
    world_size = get_world_size() if world_size is None else world_size
    p = check_input_file(path, "INPUT")
    error = _not_an_archive(p)
    if error is not None:
        raise error
    try:
        zf = zipfile.ZipFile(p)
    except (zipfile.BadZipFile, OSError) as exc:
        raise ValueError(f"{p.name}: not a readable .npz archive ({exc})") from exc
    with zf, open(p, "rb") as fh:
        members = {n[:-4]: n for n in zf.namelist() if n.endswith(".npy")}
        names = _check_names(p, set(members))
        shapes = {k: _npy_member(p, zf, fh, members[k])[0] for k in ARRAYS if k in names}
        n = shapes["embeddings"][0] if shapes["embeddings"] else 0
        out = {}
        for k in ARRAYS:
            if k not in names:
                continue
            axis = _ROW_AXIS.get(k, 0)
            length = shapes[k][axis] if len(shapes[k]) > axis else -1
            if k in _ROW_AXIS and length != n:
                raise ValueError(
                    f"{p.name}: length mismatch: `{k}` has {length} rows, `embeddings` has {n}"
                )
            lo, hi = shard_range(length, rank, world_size)
            out[k] = _read_rows(p, zf, fh, members[k], lo, hi, axis)
        return out


def _npy_member(
    p: Path, zf: zipfile.ZipFile, fh: Any, member: str
) -> tuple[tuple[int, ...], np.dtype | None, int | None]:
    """Shape, dtype and absolute data offset of an uncompressed C-order ``.npy`` member
    (dtype and offset None when it must be read whole: compressed or Fortran order)."""
    info = zf.getinfo(member)
    if info.compress_type != zipfile.ZIP_STORED:
        with zf.open(member) as f:
            shape, _, dtype = _npy_header(p, f, member)
        return shape, None, None
    fh.seek(info.header_offset)
    local = fh.read(30)
    if len(local) != 30 or local[:4] != b"PK\x03\x04":
        raise ValueError(f"{p.name}: array `{member[:-4]}` cannot be read (bad zip entry)")
    name_len, extra_len = struct.unpack("<HH", local[26:30])
    fh.seek(info.header_offset + 30 + name_len + extra_len)
    shape, fortran, dtype = _npy_header(p, fh, member)
    if fortran or dtype.hasobject:
        return shape, None, None
    return shape, dtype, fh.tell()


def _npy_header(p: Path, f: Any, member: str) -> tuple[tuple[int, ...], bool, np.dtype]:
    try:
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            return np.lib.format.read_array_header_1_0(f)
        return np.lib.format.read_array_header_2_0(f)
    except ValueError as exc:
        raise ValueError(f"{p.name}: array `{member[:-4]}` cannot be read ({exc})") from exc


def _read_rows(
    p: Path, zf: zipfile.ZipFile, fh: Any, member: str, lo: int, hi: int, axis: int
) -> np.ndarray:
    """Rows ``lo:hi`` along ``axis`` (0 or 1) of one array of the archive."""
    shape, dtype, start = _npy_member(p, zf, fh, member)
    if dtype is None or start is None:  # compressed or Fortran order: read whole, slice
        with np.load(p, allow_pickle=False) as f:
            whole = f[member[:-4]]
        return np.ascontiguousarray(np.take(whole, np.arange(lo, hi), axis=axis))
    inner = int(np.prod(shape[axis + 1 :], dtype=np.int64))
    outer = int(np.prod(shape[:axis], dtype=np.int64))
    n = shape[axis] if shape else 1
    out = np.empty((*shape[:axis], hi - lo, *shape[axis + 1 :]), dtype=dtype)
    flat = out.reshape(outer, (hi - lo) * inner)
    for o in range(outer):
        # straight into the result: a temporary of the shard's size, once freed, raised the
        # allocator's mmap threshold so later freed blocks stayed resident
        if flat.shape[1] == 0:  # a rank with no rows
            break
        fh.seek(start + (o * n + lo) * inner * dtype.itemsize)
        if fh.readinto(memoryview(flat[o]).cast("B")) != flat[o].nbytes:
            raise ValueError(f"{p.name}: array `{member[:-4]}` is truncated")
    return out


def _tensor(name: str, a: np.ndarray, device: str) -> torch.Tensor:
    if a.dtype.kind not in "fiub":
        raise ValueError(f"array `{name}` has unsupported dtype {a.dtype}")
    t = torch.from_numpy(np.ascontiguousarray(a))
    if name == "labels":
        return t.to(device)
    return t.to(device=device, dtype=torch.float64 if a.dtype == np.float64 else torch.float32)


def evaluate_npz(
    path: str | Path, *, device: str = "cpu", distributed: bool = False, **kwargs: Any
) -> dict[str, Any]:
    """:func:`bayesurl.evaluation.evaluate` on the arrays of an .npz file.

    Parameters
    ----------
    path : str or Path
        INPUT.npz.
    device : str
        Torch device to evaluate on.
    distributed : bool
        Under an initialised process group: each rank reads its rows
        (:func:`load_npz_shard`) and the evaluation is sharded; every rank gets
        the metrics.
    **kwargs
        Passed to :func:`~bayesurl.evaluation.evaluate`.

    Returns
    -------
    dict
        The metrics.
    """
    from bayesurl.evaluation import evaluate

    loaded = load_npz_shard(path) if distributed else load_npz(path)
    arrays = {k: _tensor(k, v, device) for k, v in loaded.items()}
    if distributed:
        kwargs["distributed"] = True
    del loaded  # the arrays are ours: the search normalises the embeddings in place (copy=False)
    return evaluate(
        arrays.pop("embeddings"),
        arrays.pop("labels"),
        **arrays,
        copy=False,
        **kwargs,
    )


def format_table(res: dict[str, Any]) -> str:
    """Text table of the scalar metrics, each beside its 95 % interval and what that interval
    is (method, n), then the notes: why a metric is n/a, and the notes of
    :mod:`bayesurl.evaluation.notes` (an AUROC at chance or inverted by its interval, u
    nearly constant, R@1 at chance)."""
    ivs = res.get("intervals") or {}
    rows = [(k, v) for k, v in res.items() if isinstance(v, (int, float)) or v is None]
    width = max(len(k) for k, _ in rows)
    cells = []
    for k, v in rows:
        if v is None:
            s = "n/a"
        elif isinstance(v, float):
            s = f"{v:.4f}" if math.isfinite(v) else str(v)
        else:
            s = str(v)
        iv = ivs.get(k)
        bounds = "" if iv is None else f"[{iv.low:.4f}, {iv.high:.4f}]"
        how = "" if iv is None else f"{iv.method}, n = {iv.n} {iv.over}"
        cells.append((k, s, bounds, how))
    level = next(iter(ivs.values())).level if ivs else 0.95
    head = f"{100 * level:g} % interval"
    wv = max(len("value"), *(len(c[1]) for c in cells))
    wb = max(len(head), *(len(c[2]) for c in cells))
    lines = [
        f"{'metric':<{width}}  {'value':<{wv}}  {head:<{wb}}  method, units",
        f"{'-' * width}  {'-' * wv}  {'-' * wb}  {'-' * 13}",
    ]
    lines += [f"{k:<{width}}  {s:<{wv}}  {b:<{wb}}  {h}".rstrip() for k, s, b, h in cells]
    if ivs:
        lines.append(
            "intervals over the queries (and OOD inputs), treated as independent: Wilson for "
            "a share, DeLong for an AUROC, a Poisson bootstrap for the rest (docs: Concepts > "
            "Metrics, Intervals)"
        )
    lines += [f"note: {n}" for n in res.get("notes", [])]
    lines += [f"note: {n.text}" for n in getattr(res, "caveats", [])]
    return "\n".join(lines)


def json_ready(res: dict[str, Any]) -> dict[str, Any]:
    """``res`` for ``--json``: each interval as flat fields (``<key>_low``, ``<key>_high``,
    ``<key>_interval``, ``<key>_n``, ``<key>_over``, ``interval_level``), the notes of
    :mod:`bayesurl.evaluation.notes` under ``caveats``."""
    from bayesurl.stats.intervals import flat_intervals

    out = {k: v for k, v in res.items() if k != "intervals"}
    out.update(flat_intervals(res.get("intervals") or {}))
    out["caveats"] = [n.text for n in getattr(res, "caveats", [])]
    return out


def _check_args(args: argparse.Namespace) -> None:
    """Validate every option before any work: one clear error naming the option."""
    if args.checkpoint is not None and args.input is not None:
        raise ValueError("give either INPUT.npz or --checkpoint, not both")
    if args.checkpoint is None and args.input is None:
        raise ValueError("give INPUT.npz or --checkpoint CKPT")
    args.device = str(resolve_device(args.device, "--device"))
    args.ks = list(check_ints(args.ks, "--ks", low=1))
    check_int(args.nproc_per_node, "--nproc-per-node", low=1)
    if args.nproc_per_node > 1 and launched_by_torchrun():
        raise ValueError(
            "--nproc-per-node: already launched by torchrun "
            f"(WORLD_SIZE={os.environ.get('WORLD_SIZE')}); use one launcher, not both"
        )
    if args.shortlist is not None:
        check_int(args.shortlist, "--shortlist", low=1)
    for opt in ("n_samples", "max_test", "max_ood"):
        value = getattr(args, opt, None)
        if value is not None:
            check_int(value, "--" + opt.replace("_", "-"), low=0 if opt == "n_samples" else 1)
    if args.input is not None:
        check_input_file(args.input, "INPUT")
    if args.checkpoint is not None:
        check_input_file(args.checkpoint, "--checkpoint")


def run(args: argparse.Namespace) -> int:
    """Run ``bayesurl evaluate``."""
    _check_args(args)
    if args.nproc_per_node > 1:
        return _launch_local(args)
    if launched_by_torchrun():
        return _run_distributed(args)
    if args.checkpoint is not None:
        return _run_checkpoint(args)
    res = evaluate_npz(
        args.input,
        device=args.device,
        ks=tuple(args.ks),
        ece_mode=args.ece_mode,
        shortlist=args.shortlist,
    )
    print(format_table(res))
    if args.json:
        write_json(args.json, json_ready(res))
    return 0


def _launch_local(args: argparse.Namespace) -> int:
    """``--nproc-per-node W``: the torchrun code path in W ranks started from this process
    (forked on CPU, spawned on CUDA).

    The modules a rank needs are imported before the fork, once, so every forked rank starts
    from them (torchrun's launcher starts W fresh interpreters, each importing torch again); a
    rank's failure stops the others and is reported here.
    """
    import bayesurl.evaluation.evaluator  # noqa: F401  (imported once, before the fork)
    from bayesurl.distributed import launch_local

    if args.checkpoint is not None:
        import bayesurl.runs.runner  # noqa: F401
    # on CUDA the ranks are spawned: a process forked after the parent queried CUDA (the
    # --device check) cannot use it; on CPU they are forked (no second import)
    start = "fork" if str(args.device) == "cpu" else "spawn"
    # a rank's failure: bayesurl.distributed.RankFailedError, one line from the CLI
    launch_local(_run_distributed, args.nproc_per_node, (args,), start_method=start)
    return 0


def _run_distributed(args: argparse.Namespace) -> int:
    """Sharded evaluation under torchrun: every rank reads / embeds its rows,
    rank 0 prints and writes the JSON."""
    from bayesurl.distributed import cleanup, init_from_env, is_main_process

    info = init_from_env(device="cpu" if str(args.device) == "cpu" else None)
    device = str(info.device)
    try:
        if args.checkpoint is not None:
            # every rank loads the method and builds the sets; the run pipeline's scorer
            # (bayesurl.runs.predict.score) embeds only this rank's block of batches of each set
            # and evaluates sharded; rank 0 reports
            args.device = device
            return _run_checkpoint(args)
        res = evaluate_npz(
            args.input,
            device=device,
            distributed=True,
            ks=tuple(args.ks),
            ece_mode=args.ece_mode,
            shortlist=args.shortlist,
        )
        if is_main_process():
            print(format_table(res))
            if args.json:
                write_json(args.json, json_ready(res))
        return 0
    finally:
        cleanup()


def _run_checkpoint(args: argparse.Namespace) -> int:
    from bayesurl.distributed import is_main_process
    from bayesurl.runs.runner import evaluate_checkpoint

    res = evaluate_checkpoint(
        args.checkpoint,
        dataset=args.dataset,
        root=args.root,
        n_samples=args.n_samples,
        max_test=args.max_test,
        max_ood=args.max_ood,
        device=args.device,
        ks=tuple(args.ks),
        ece_mode=args.ece_mode,
        shortlist=args.shortlist,
    )
    if not is_main_process():
        return 0
    print(f"{res['method']} ({res['checkpoint']}) zero-shot on {res['dataset']}")
    print(format_table(res))
    if args.json:
        write_json(args.json, json_ready(res))
    return 0
