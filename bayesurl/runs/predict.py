"""The one embedding loop and the one sampling rule of every run (docs/concepts/uncertainty.rst,
"Samples").

:func:`predict` runs ``fn(x, n_samples) -> Output`` over a data set in batches (transformed on
the device), seeded so the draws are reproducible without touching the caller's random state.
:func:`n_samples_for` is the sampling rule: ``S`` draws for an estimator with an embedding
distribution, none otherwise -- so the ECE of HET-XL or MC dropout does not depend on which
command ran them. :func:`score` is the zero-shot evaluation of URL section 3.2 on top:
:func:`bayesurl.evaluation.evaluate` on the downstream test set, OOD AUROC / AUPRC of u on the
OOD set against u on the held-out upstream set (docs/concepts/zero_shot.rst).

Under an initialised ``torch.distributed`` process group with more than one rank (``torchrun``)
:func:`score` is sharded: every rank predicts only its contiguous block of whole
batches of each set (:func:`batch_shard`) and :func:`bayesurl.evaluation.evaluate` runs with
``distributed=True``; one process is the ``W = 1`` case of the same code. No
:class:`~torch.utils.data.distributed.DistributedSampler` is used: it interleaves and pads rows,
which would change the global row order that breaks similarity ties (lowest global index).
Draws are seeded per *global* batch index, and shards are cut on the global batch grid, so
every input is predicted in the same batch with the same seed whatever the number of ranks:
the outputs, and hence every metric (the draw-based ECE included), equal the single-process ones.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable
from dataclasses import fields
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor, nn

from bayesurl._checks import check_int
from bayesurl._modules import device_of, eval_mode
from bayesurl.distributed import is_distributed
from bayesurl.evaluation import NeighborMemo, evaluate
from bayesurl.types import Output

__all__ = [
    "PredictFn",
    "batch_seed",
    "batch_shard",
    "embed",
    "epoch_evaluator",
    "n_samples_for",
    "predict",
    "score",
    "transformed_inputs",
]

#: ``fn(x, n_samples) -> Output`` on one transformed batch
PredictFn = Callable[[Tensor, int], Output]


def n_samples_for(has_distribution: bool, requested: int) -> int:
    """The sampling rule: ``requested`` draws where a distribution is defined, else 0.

    Raises
    ------
    ValueError
        If ``requested`` is negative.
    """
    check_int(requested, "n_samples", low=0)
    return int(requested) if has_distribution else 0


def batch_seed(seed: int, batch: int) -> int:
    """The torch seed of global batch ``batch`` of a prediction seeded with ``seed``.

    Seeding each batch by its global index (not one stream over the whole set) makes a batch's
    draws independent of which rank predicts it (:func:`batch_shard`).
    """
    state = np.random.SeedSequence([int(seed) & 0xFFFFFFFF, int(batch)]).generate_state(2)
    return int(state[0]) << 31 | int(state[1]) >> 1


def batch_shard(
    n: int,
    batch_size: int,
    rank: int | None = None,
    world_size: int | None = None,
    group: dist.ProcessGroup | None = None,
) -> tuple[int, int]:
    """Rows ``[lo, hi)`` of ``n`` that ``rank`` predicts: a contiguous block of whole batches.

    The ``ceil(n / batch_size)`` batches of the global grid are split with
    :func:`bayesurl.distributed.shard_range` (the first ranks get one batch more; a rank may
    get none, ``lo == hi``), so rank ``r``'s rows follow rank ``r - 1``'s and each batch is the
    one a single process would form. Defaults: this process's rank and world size in ``group``.
    """
    from bayesurl.distributed import get_rank, get_world_size, shard_range

    check_int(batch_size, "batch_size", low=1)
    rank = get_rank(group) if rank is None else rank
    world_size = get_world_size(group) if world_size is None else world_size
    b_lo, b_hi = shard_range(math.ceil(n / batch_size), rank, world_size)
    return min(b_lo * batch_size, n), min(b_hi * batch_size, n)


def _batches(dataset: Any, batch_size: int, lo: int, hi: int) -> Any:
    """``(x, y)`` batches of rows ``lo:hi`` (``lo`` on the batch grid)."""
    from bayesurl.data import ImageTensorDataset, make_loader

    if isinstance(dataset, Tensor):  # a tensor of inputs, no labels
        for i in range(lo, hi, batch_size):
            yield dataset[i : min(i + batch_size, hi)], None
        return
    if isinstance(dataset, ImageTensorDataset):  # in memory: slice the stored images
        for i in range(lo, hi, batch_size):
            j = min(i + batch_size, hi)
            yield dataset.images[i:j], dataset.targets[i:j]
        return
    rows = (
        dataset
        if (lo, hi) == (0, len(dataset))
        else torch.utils.data.Subset(dataset, range(lo, hi))
    )
    # never a DistributedSampler here: the rows are this rank's already
    yield from make_loader(rows, batch_size, shuffle=False, distributed=False)


def transformed_inputs(
    dataset: Any,
    indices: Any,
    transform: Any | None,
    device: torch.device | str = "cpu",
) -> Tensor:
    """Rows ``indices`` of ``dataset`` as one transformed input batch, as :func:`predict` sees
    them (same reader, same transform on ``device``): for checks that feed an estimator a fixed
    set of inputs (URL's crop test, the training-curve probe).

    Raises
    ------
    ValueError
        If ``indices`` is empty.
    """
    idx = [int(i) for i in indices]
    if not idx:
        raise ValueError("`indices` must name at least one row")
    dev = torch.device(device)
    rows = torch.utils.data.Subset(dataset, idx)
    x = torch.cat([xb for xb, _ in _batches(rows, len(idx), 0, len(idx))]).to(dev)
    tf = transform.to(dev) if isinstance(transform, nn.Module) else transform
    return x if tf is None else tf(x)


def _no_rows(out: Output) -> Output:
    """``out`` with its N rows cut to none (the fields and shapes kept)."""
    return Output(
        **{
            k: (None if v is None else (v[:, :0] if k == "samples" else v[:0]))
            for k, v in ((f.name, getattr(out, f.name)) for f in fields(out))
        }
    )


@torch.no_grad()
def predict(
    fn: PredictFn,
    dataset: Any,
    transform: nn.Module | None,
    *,
    n_samples: int = 0,
    batch_size: int = 500,
    device: str | torch.device = "cpu",
    seed: int | None = 0,
    rows: tuple[int, int] | None = None,
) -> tuple[Output, Tensor]:
    """``fn`` over a whole data set: the concatenated :class:`~bayesurl.Output` and labels.

    Parameters
    ----------
    fn : callable
        ``fn(x, n_samples) -> Output`` on a transformed batch (an estimator's ``predict``).
    dataset : Dataset or Tensor
        ``(image, label)`` items (in-memory sets are sliced, others read by a loader), or a
        tensor of inputs ``[N, ...]`` (the returned labels are then empty).
    transform : nn.Module, optional
        Batch transform applied on ``device`` (e.g. ``uint8`` -> normalised float).
    n_samples : int
        Draws ``S`` per input (apply :func:`n_samples_for` first).
    batch_size : int
        Inputs per call of ``fn``.
    device : str or torch.device
        Where the batches go; the outputs stay there.
    seed : int or None
        Seeds torch inside a forked random state (the caller's state is untouched) before each
        batch, with :func:`batch_seed` of the batch's global index; ``None`` uses the current
        state.
    rows : (int, int), optional
        Predict only rows ``lo:hi`` (``lo`` a multiple of ``batch_size``, e.g.
        :func:`batch_shard`); the batches and their seeds are those of the whole set. An empty
        range gives outputs with no rows (the shapes from one probe row). Default: all rows.

    Raises
    ------
    ValueError
        For an empty data set or a bad ``batch_size`` / ``n_samples`` / ``rows``.
    """
    if len(dataset) == 0 or (isinstance(dataset, Tensor) and dataset.ndim < 2):
        raise ValueError("`dataset` is empty (or not a batch [N, ...])")
    check_int(batch_size, "batch_size", low=1)
    check_int(n_samples, "n_samples", low=0)
    bs, n = int(batch_size), len(dataset)
    lo, hi = (0, n) if rows is None else (int(rows[0]), int(rows[1]))
    if not 0 <= lo <= hi <= n or (lo < hi and lo % bs):
        raise ValueError(
            f"`rows` must be a range within [0, {n}] starting on the batch grid "
            f"(a multiple of batch_size={bs}), got {rows}"
        )
    empty = lo == hi
    if empty:  # predict one row for the output's fields and shapes, return none of it
        lo, hi = 0, 1
    dev = torch.device(device)
    tf = transform.to(dev) if isinstance(transform, nn.Module) else transform
    cuda = [dev] if dev.type == "cuda" else []
    outs, labels = [], []
    with torch.random.fork_rng(devices=cuda, enabled=seed is not None):
        for b, (x, y) in enumerate(_batches(dataset, bs, lo, hi), start=lo // bs):
            if seed is not None:
                torch.manual_seed(batch_seed(int(seed), b))
            x = x.to(dev)
            if tf is not None:
                x = tf(x)
            outs.append(fn(x, int(n_samples)).detach())
            if y is not None:
                labels.append(torch.as_tensor(y))
    out = Output.cat(outs)
    y_all = torch.cat(labels) if labels else torch.empty(0, dtype=torch.long)
    return (_no_rows(out), y_all[:0]) if empty else (out, y_all)


def score(
    fn: PredictFn,
    sets: Any,
    transform: nn.Module | None,
    *,
    n_samples: int = 0,
    batch_size: int = 500,
    device: str | torch.device = "cpu",
    seed: int = 0,
    return_outputs: bool = False,
    distributed: bool | dist.ProcessGroup | None = None,
    crop_images: int = 0,
    neighbor_memo: NeighborMemo | None = None,
    **evaluate_kwargs: Any,
) -> dict[str, Any]:
    """Zero-shot evaluation of ``fn`` on ``sets`` (a :class:`~bayesurl.data.ZeroShotData`).

    Embeds the downstream ``test`` set (every image is a query, URL section 3.2), the held-out
    upstream ``id_test`` set and the ``ood`` set, and scores them in one call of
    :func:`bayesurl.evaluation.evaluate` (docs/concepts/metrics.rst): R@1, R-AUROC, AUSC / AUSE,
    mAP@5, -- with samples -- the retrieval ECE, OOD AUROC / AUPRC of u on ``sets.ood`` (positive
    class) against u on ``sets.id_test`` (docs/concepts/zero_shot.rst), the mixed 50/50 ``id_test``
    / ``test`` R-AUROC (URL App. C.5) and, with ``crop_images``, URL's crop test (section 4.5).
    Sharded, each rank predicts its :func:`batch_shard` of every set and every rank returns
    the single-process metrics (see the module docs); every rank of the group must call it.

    Parameters
    ----------
    fn : callable
        ``fn(x, n_samples) -> Output`` (the same model on every rank).
    sets : ZeroShotData
        ``test`` required; ``id_test`` and ``ood`` optional.
    transform : nn.Module, optional
        Batch transform of the stored images.
    n_samples : int
        Draws for the ECE (0: no ECE, reported as ``None``).
    batch_size, device, seed
        As for :func:`predict` (each set is predicted with ``seed``).
    return_outputs : bool
        Also return the predicted ``Output`` s and labels under ``"outputs"`` (sharded: this
        rank's rows); unsharded, ``outputs["test_neighbors"]`` holds the evaluator's neighbour
        ids of the queries (``[N, k]``, self excluded).
    distributed : bool or ProcessGroup, optional
        ``None``: shard when a process group with more than one rank is initialised
        (:func:`bayesurl.distributed.is_distributed`); ``False``: every rank evaluates
        everything; ``True``: shard over the default group; a process group: shard over it.
    crop_images : int
        Evenly spaced ``test`` images of URL's crop test (0: none), predicted without draws.
    neighbor_memo : NeighborMemo, optional
        Reuse the kNN search of a test embedding scored before, bit for bit the same (a
        post-hoc estimator and its base), and keep this one's; not when sharded.
    **evaluate_kwargs
        Passed to :func:`bayesurl.evaluation.evaluate` (``ks``, ``ece_mode``, ...).

    Returns
    -------
    dict
        The evaluator's result plus ``n_samples`` (the draws the predictions held), ``n_test``,
        ``n_id_test``, ``n_ood`` and ``eval_time`` (seconds, this rank's).

    Raises
    ------
    ValueError
        Without a ``test`` set, or sharding without an initialised process group.
    """
    t0 = time.perf_counter()
    shard = _shard_of(sets, distributed, evaluate_kwargs)
    kw = {"batch_size": batch_size, "device": device, "seed": seed}
    outputs, extra = _predict_sets(fn, sets, transform, n_samples, crop_images, shard, kw)
    memo = None if shard else neighbor_memo
    res, neighbors = _evaluate_test(outputs["test"], extra, n_samples, shard, memo,
                                    return_outputs, evaluate_kwargs)  # fmt: skip
    _annotate(res, sets, outputs["test"][0], n_samples)
    res["eval_time"] = time.perf_counter() - t0
    if return_outputs:
        if neighbors is not None and not shard:  # each query's nearest neighbour, for the record
            outputs["test_neighbors"] = neighbors
        res["outputs"] = outputs
    return res


def _shard_of(
    sets: Any, distributed: bool | dist.ProcessGroup | None, evaluate_kwargs: dict[str, Any]
) -> dict[str, Any]:
    """The evaluator's sharding keywords for :func:`score` (empty: not sharded), checked."""
    if getattr(sets, "test", None) is None:
        raise ValueError("`data` has no `test` set")
    if "group" in evaluate_kwargs:  # the keyword of earlier releases, kept for one release
        group = evaluate_kwargs.pop("group")
        warnings.warn(
            "score's `group` is deprecated; pass the process group as `distributed=group`",
            DeprecationWarning,
            stacklevel=3,
        )
        if group is not None and distributed in (None, True):
            distributed = group
    if distributed is None:
        return {"distributed": True, "group": None} if is_distributed() else {}
    if distributed is False:
        return {}
    if not (dist.is_available() and dist.is_initialized()):
        raise ValueError(
            "`distributed` needs an initialised torch.distributed process group "
            "(run under torchrun, or call bayesurl.distributed.init_from_env())"
        )
    return {"distributed": True, "group": None if distributed is True else distributed}


def _predict_sets(
    fn: PredictFn,
    sets: Any,
    transform: nn.Module | None,
    n_samples: int,
    crop_images: int,
    shard: dict[str, Any],
    kw: dict[str, Any],
) -> tuple[dict[str, Any], dict[str, Any]]:
    """This rank's rows of every set predicted: the outputs and the evaluator's extra inputs."""

    def rows_of(dataset: Any) -> tuple[int, int]:
        n = len(dataset)
        return batch_shard(n, int(kw["batch_size"]), group=shard["group"]) if shard else (0, n)

    out, y = predict(fn, sets.test, transform, n_samples=n_samples, rows=rows_of(sets.test), **kw)
    outputs: dict[str, Any] = {"test": (out, y)}
    id_set, ood_set = getattr(sets, "id_test", None), getattr(sets, "ood", None)
    extra: dict[str, Any] = {}
    if id_set is not None and ood_set is not None:
        o_id, y_id = predict(fn, id_set, transform, rows=rows_of(id_set), **kw)
        o_ood, y_ood = predict(fn, ood_set, transform, rows=rows_of(ood_set), **kw)
        outputs.update(id_test=(o_id, y_id), ood=(o_ood, y_ood))
        extra.update(
            ood_uncertainties=o_ood.uncertainty,
            id_embeddings=o_id.embedding,
            id_labels=y_id.to(o_id.embedding.device),
            id_uncertainties=o_id.uncertainty,
        )
    if crop_images:
        extra.update(_crop_inputs(fn, sets.test, transform, int(crop_images), kw["device"]))
    return outputs, extra


def _evaluate_test(
    test: tuple[Output, Tensor],
    extra: dict[str, Any],
    n_samples: int,
    shard: dict[str, Any],
    memo: NeighborMemo | None,
    return_neighbors: bool,
    evaluate_kwargs: dict[str, Any],
) -> tuple[dict[str, Any], Tensor | None]:
    """The evaluator on the test queries, its kNN search reused from and kept in ``memo``."""
    out, y = test
    n_test = out.embedding.shape[0]
    # hashed once, before the search (which may normalise the embedding in place)
    key, known = "", None
    if memo is not None:
        key = memo.key(out.embedding, str(evaluate_kwargs.get("backend", "torch")))
        known = memo.lookup(key, n_test)
    res = evaluate(
        out.embedding,
        y.to(out.embedding.device),
        uncertainties=out.uncertainty,
        samples=out.samples if n_samples > 0 else None,
        **extra,
        **shard,
        **evaluate_kwargs,
        return_neighbors=return_neighbors or memo is not None,
        neighbors=known,
    )
    neighbors = res.pop("neighbors", None)
    if (
        memo is not None
        and neighbors is not None
        and (known is None or neighbors.shape[1] > known.shape[1])
    ):
        memo.store(key, neighbors, n_test)
    return res, neighbors


def _annotate(res: dict[str, Any], sets: Any, out: Output, n_samples: int) -> None:
    """Add the draws and set sizes behind ``res`` and the note on its OOD metrics."""
    # the draws behind the ECE: a deep ensemble's are its K members, whatever was asked
    res["n_samples"] = 0 if n_samples == 0 or out.samples is None else int(out.samples.shape[0])
    id_set, ood_set = getattr(sets, "id_test", None), getattr(sets, "ood", None)
    res["n_test"] = len(sets.test)
    res["n_id_test"] = None if id_set is None else len(id_set)
    res["n_ood"] = None if ood_set is None else len(ood_set)
    res["notes"] = [n for n in res["notes"] if not n.startswith("ood_auroc")]
    if id_set is not None and ood_set is not None:
        res["notes"].append("ood_auroc, ood_auprc: u(ood) vs u(id_test), OOD = positive class")
    else:
        res["notes"].append("ood_auroc, ood_auprc: the data have no `id_test` / `ood` set")


def _crop_inputs(
    fn: PredictFn, test: Any, transform: nn.Module | None, count: int, device: Any
) -> dict[str, Any]:
    """URL's crop test inputs: ``count`` evenly spaced ``test`` images, transformed as
    :func:`predict` sees them, and ``images -> u`` of ``fn`` without draws."""

    def predict_uncertainty(images: Tensor) -> Tensor:
        u = fn(images, 0).uncertainty
        if u is None:
            raise ValueError("the estimator returns no uncertainty without draws")
        return u.reshape(-1)

    n = len(test)
    idx = torch.linspace(0, n - 1, min(count, n)).round().long().unique()
    images = transformed_inputs(test, idx.tolist(), transform, device).float()
    return {"predict_uncertainty": predict_uncertainty, "crop_images": images}


def _method_fn(method: nn.Module) -> PredictFn:
    def fn(x: Tensor, n: int) -> Output:
        return method(x, n_samples=n)

    return fn


def embed(
    method: nn.Module,
    x: Tensor,
    *,
    n_samples: int = 0,
    batch_size: int = 500,
    device: str | torch.device | None = None,
) -> Output:
    """A method over an input tensor in eval mode, in batches (:func:`predict` on a tensor).

    Parameters
    ----------
    method : Method
        Any module with ``forward(x, n_samples) -> Output``.
    x : Tensor
        ``[N, ...]`` transformed inputs.
    n_samples : int
        Draws ``S`` (``samples [S, N, D]``); 0 for none.
    batch_size : int
        Inputs per forward pass.
    device : str or torch.device, optional
        Where to run (default: the method's device).

    Raises
    ------
    ValueError
        If ``x`` is empty or ``batch_size`` / ``n_samples`` are invalid.
    """
    if not isinstance(x, Tensor) or x.ndim < 2 or x.shape[0] < 1:
        raise ValueError(f"`x` must be a non-empty batch tensor [N, ...], got {type(x).__name__}")
    dev = torch.device(device) if device is not None else device_of(method, x.device)
    with eval_mode(method):
        out, _ = predict(
            _method_fn(method),
            x,
            None,
            n_samples=n_samples,
            batch_size=batch_size,
            device=dev,
            seed=None,
        )
    return out


def _method_transform(method: nn.Module) -> nn.Module:
    """The batch transform of stored ``uint8`` images for ``method``:
    :func:`bayesurl.data.default_transform` with the channels its backbone expects
    (:func:`bayesurl.backbones.data_config`)."""
    from bayesurl.backbones import data_config
    from bayesurl.data import default_transform

    hp = getattr(method, "hparams", {}) or {}
    kw = dict(hp.get("backbone_kwargs") or {})
    name = hp.get("backbone", "small_convnet")
    channels = data_config(name, **kw).in_chans if isinstance(name, str) else 1
    return default_transform(channels)


def epoch_evaluator(
    data: Any,
    *,
    n_samples: int | None = None,
    transform: Any | None = None,
    batch_size: int = 500,
    seed: int = 0,
    **evaluate_kwargs: Any,
) -> Callable[[nn.Module, int], dict[str, Any]]:
    """An ``eval_fn(method, epoch)`` for :func:`bayesurl.training.fit`: zero-shot scores per epoch.

    Each call is :func:`score` of the method (in eval mode, on its own device) on ``data``
    (URL section 3.2). ``fit`` calls it on every rank, so under ``torchrun`` / DDP the
    evaluation is sharded: each rank embeds its block of the sets and every rank records the
    single-process metrics.

    Parameters
    ----------
    data : ZeroShotData
        ``test`` required; ``id_test`` and ``ood`` optional.
    n_samples : int, optional
        Draws for the ECE; ``None``: 10. The sampling rule (:func:`n_samples_for`) gives a
        method without a distribution 0, so its ECE is ``None``.
    transform : callable, optional
        Batch transform of the stored ``uint8`` images; default:
        :func:`bayesurl.data.default_transform` with the channels the method's backbone
        expects (:func:`bayesurl.backbones.data_config`).
    batch_size, seed, **evaluate_kwargs
        As for :func:`score`.

    Returns
    -------
    callable
        ``eval_fn(method, epoch) -> dict`` of the numeric metrics (``None`` where undefined).

    Raises
    ------
    ValueError
        If ``data`` has no ``test`` set or ``n_samples`` is negative.

    Examples
    --------
    >>> from bayesurl.training import EpochEvaluation, fit  # doctest: +SKIP
    >>> evaluation = EpochEvaluation(epoch_evaluator(data, n_samples=0))  # doctest: +SKIP
    >>> fit(method, loader, hooks=[evaluation])  # doctest: +SKIP
    """
    if getattr(data, "test", None) is None:
        raise ValueError("`data` has no `test` set")
    requested = n_samples_for(True, 10 if n_samples is None else n_samples)

    def eval_fn(method: nn.Module, epoch: int) -> dict[str, Any]:
        n = n_samples_for(bool(getattr(method, "has_distribution", False)), requested)
        tf = _method_transform(method) if transform is None else transform
        with eval_mode(method):
            res = score(
                _method_fn(method),
                data,
                tf,
                n_samples=n,
                batch_size=batch_size,
                device=device_of(method),
                seed=seed,
                **evaluate_kwargs,
            )
        return {
            k: v
            for k, v in res.items()
            if v is None or (isinstance(v, (int, float)) and not isinstance(v, bool))
        }

    return eval_fn
