"""The one embedding loop and the one sampling rule of every run (spec METRICS.md).

:func:`predict` runs ``fn(x, n_samples) -> Output`` over a data set in batches (transformed on
the device), seeded so the draws are reproducible without touching the caller's random state.
:func:`n_samples_for` is the sampling rule: ``S`` draws for an estimator with an embedding
distribution, none otherwise -- so the ECE of HET-XL or MC dropout no longer depends on which
command ran them. :func:`score` is the zero-shot evaluation of URL section 3.2 on top:
:func:`bayesurl.evaluation.evaluate` on the downstream test set, OOD AUROC / AUPRC of u on the
OOD set against u on the held-out upstream set (spec DATA.md).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from bayesurl.types import Output

__all__ = ["PredictFn", "embed", "evaluate_method", "n_samples_for", "predict", "score"]

#: ``fn(x, n_samples) -> Output`` on one transformed batch
PredictFn = Callable[[Tensor, int], Output]


def n_samples_for(has_distribution: bool, requested: int) -> int:
    """The sampling rule: ``requested`` draws where a distribution is defined, else 0.

    Raises
    ------
    ValueError
        If ``requested`` is negative.
    """
    if int(requested) < 0:
        raise ValueError(f"`n_samples` must be >= 0, got {requested}")
    return int(requested) if has_distribution else 0


def _batches(dataset: Any, batch_size: int) -> Any:
    from bayesurl.data import ImageTensorDataset, make_loader

    if isinstance(dataset, Tensor):  # a tensor of inputs, no labels
        for i in range(0, dataset.shape[0], batch_size):
            yield dataset[i : i + batch_size], None
        return
    if isinstance(dataset, ImageTensorDataset):  # in memory: slice the stored images
        for i in range(0, len(dataset), batch_size):
            yield dataset.images[i : i + batch_size], dataset.targets[i : i + batch_size]
        return
    yield from make_loader(dataset, batch_size, shuffle=False)


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
        Seeds torch inside a forked random state (the caller's state is untouched); ``None``
        uses the current state.

    Raises
    ------
    ValueError
        For an empty data set or a bad ``batch_size`` / ``n_samples``.
    """
    if len(dataset) == 0 or (isinstance(dataset, Tensor) and dataset.ndim < 2):
        raise ValueError("`dataset` is empty (or not a batch [N, ...])")
    if int(batch_size) < 1:
        raise ValueError(f"`batch_size` must be >= 1, got {batch_size}")
    if int(n_samples) < 0:
        raise ValueError(f"`n_samples` must be >= 0, got {n_samples}")
    dev = torch.device(device)
    tf = transform.to(dev) if isinstance(transform, nn.Module) else transform
    cuda = [dev] if dev.type == "cuda" else []
    outs, labels = [], []
    with torch.random.fork_rng(devices=cuda, enabled=seed is not None):
        if seed is not None:
            torch.manual_seed(int(seed))
        for x, y in _batches(dataset, int(batch_size)):
            x = x.to(dev)
            if tf is not None:
                x = tf(x)
            outs.append(fn(x, int(n_samples)).detach())
            if y is not None:
                labels.append(torch.as_tensor(y))
    return Output.cat(outs), (torch.cat(labels) if labels else torch.empty(0, dtype=torch.long))


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
    **evaluate_kwargs: Any,
) -> dict[str, Any]:
    """Zero-shot evaluation of ``fn`` on ``sets`` (a :class:`~bayesurl.data.ZeroShotData`).

    Embeds the downstream ``test`` set (every image is a query, URL section 3.2) and computes
    R@1, R-AUROC, AUSC / AUSE, mAP@5 and -- with samples -- the retrieval ECE with
    :func:`bayesurl.evaluation.evaluate` (METRICS.md). OOD AUROC / AUPRC compare u on
    ``sets.ood`` (positive class) with u on ``sets.id_test`` (DATA.md).

    Parameters
    ----------
    fn : callable
        ``fn(x, n_samples) -> Output``.
    sets : ZeroShotData
        ``test`` required; ``id_test`` and ``ood`` optional.
    transform : nn.Module, optional
        Batch transform of the stored images.
    n_samples : int
        Draws for the ECE (0: no ECE, reported as ``None``).
    batch_size, device, seed
        As for :func:`predict` (each set is predicted with ``seed``).
    return_outputs : bool
        Also return the predicted ``Output`` s and labels under ``"outputs"``.
    **evaluate_kwargs
        Passed to :func:`bayesurl.evaluation.evaluate` (``ks``, ``ece_mode``, ...).

    Returns
    -------
    dict
        The evaluator's result plus ``ood_auroc`` / ``ood_auprc``, ``n_samples``, ``n_test``,
        ``n_id_test``, ``n_ood`` and ``eval_time`` (seconds).
    """
    from bayesurl.evaluation import evaluate
    from bayesurl.evaluation import functional as Fm

    t0 = time.perf_counter()
    if getattr(sets, "test", None) is None:
        raise ValueError("`data` has no `test` set")
    kw = {"batch_size": batch_size, "device": device, "seed": seed}
    out, y = predict(fn, sets.test, transform, n_samples=n_samples, **kw)
    res = evaluate(
        out.embedding,
        y.to(out.embedding.device),
        uncertainties=out.uncertainty,
        samples=out.samples if n_samples > 0 else None,
        **evaluate_kwargs,
    )
    res["n_samples"] = int(n_samples)
    res["n_test"] = int(y.shape[0])
    id_set, ood_set = getattr(sets, "id_test", None), getattr(sets, "ood", None)
    res["n_id_test"] = None if id_set is None else len(id_set)
    res["n_ood"] = None if ood_set is None else len(ood_set)
    outputs: dict[str, Any] = {"test": (out, y)}
    res["notes"] = [n for n in res["notes"] if not n.startswith("ood_auroc")]
    if id_set is not None and ood_set is not None:
        o_id, y_id = predict(fn, id_set, transform, **kw)
        o_ood, y_ood = predict(fn, ood_set, transform, **kw)
        res["ood_auroc"] = float(Fm.ood_auroc(o_id.uncertainty, o_ood.uncertainty))
        res["ood_auprc"] = float(Fm.ood_auprc(o_id.uncertainty, o_ood.uncertainty))
        res["notes"].append("ood_auroc, ood_auprc: u(ood) vs u(id_test), OOD = positive class")
        outputs.update(id_test=(o_id, y_id), ood=(o_ood, y_ood))
    else:
        res["notes"].append("ood_auroc, ood_auprc: the data have no `id_test` / `ood` set")
    res["eval_time"] = time.perf_counter() - t0
    if return_outputs:
        res["outputs"] = outputs
    return res


def _method_fn(method: nn.Module) -> PredictFn:
    def fn(x: Tensor, n: int) -> Output:
        return method(x, n_samples=n)

    return fn


def _device_of(method: nn.Module, fallback: torch.device) -> torch.device:
    p = next(method.parameters(), None)
    return p.device if p is not None else fallback


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
    dev = torch.device(device) if device is not None else _device_of(method, x.device)
    was_training = method.training
    method.eval()
    try:
        out, _ = predict(
            _method_fn(method),
            x,
            None,
            n_samples=n_samples,
            batch_size=batch_size,
            device=dev,
            seed=None,
        )
    finally:
        method.train(was_training)
    return out


def evaluate_method(
    method: nn.Module,
    data: Any,
    *,
    n_samples: int | None = None,
    transform: Any | None = None,
    batch_size: int = 500,
    device: str | torch.device | None = None,
    seed: int = 0,
    **evaluate_kwargs: Any,
) -> dict[str, Any]:
    """:func:`score` of a trained method on a :class:`~bayesurl.data.ZeroShotData`.

    Parameters
    ----------
    method : Method
        The trained method (kept in eval mode while it runs).
    data : ZeroShotData
        ``test`` required; ``id_test`` and ``ood`` optional.
    n_samples : int, optional
        Draws for the ECE; ``None``: 10. The sampling rule (:func:`n_samples_for`) gives a
        method without a distribution 0, so its ECE is ``None``.
    transform : callable, optional
        Batch transform of the stored ``uint8`` images; default:
        :func:`bayesurl.data.default_transform` with the channels the method's backbone
        expects (:func:`bayesurl.backbones.data_config`).
    batch_size, device, seed, **evaluate_kwargs
        As for :func:`score` (default device: the method's).
    """
    from bayesurl.backbones import data_config
    from bayesurl.data import default_transform

    requested = 10 if n_samples is None else n_samples
    n = n_samples_for(bool(getattr(method, "has_distribution", False)), requested)
    if transform is None:
        hp = getattr(method, "hparams", {}) or {}
        kw = {k: v for k, v in dict(hp.get("backbone_kwargs") or {}).items()}
        name = hp.get("backbone", "small_convnet")
        channels = data_config(name, **kw).in_chans if isinstance(name, str) else 1
        transform = default_transform(channels)
    dev = torch.device(device) if device is not None else _device_of(method, torch.device("cpu"))
    was_training = method.training
    method.eval()
    try:
        return score(
            _method_fn(method),
            data,
            transform,
            n_samples=n,
            batch_size=batch_size,
            device=dev,
            seed=seed,
            **evaluate_kwargs,
        )
    finally:
        method.train(was_training)
