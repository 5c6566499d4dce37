"""The folder road: :func:`score_folder` (the steps of :mod:`bayesurl.folder`)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from bayesurl.evaluation import evaluate
from bayesurl.folder.encode import encode_folder
from bayesurl.folder.fit import crossfit, fit_pairs, fit_wrapper
from bayesurl.folder.methods import FIT_PLANS
from bayesurl.folder.options import FolderOptions
from bayesurl.folder.write import folder_info, write_outputs
from bayesurl.runs.predict import predict
from bayesurl.runs.queries import QueryRecord, query_record

__all__ = ["FolderResult", "score_folder"]


@dataclass
class FolderResult:
    """What :func:`score_folder` measured.

    Attributes
    ----------
    record : QueryRecord
        u, nearest neighbour and hit flag of every readable image.
    metrics : dict or None
        The evaluator's metrics (labelled folders with >= 2 classes), else ``None``.
    skipped : list of (str, str)
        Unreadable files and their errors.
    info : dict
        Settings, sizes, timings (``folder.json``).
    paths : dict
        The files written.
    """

    record: QueryRecord
    metrics: dict[str, Any] | None
    skipped: list[tuple[str, str]]
    info: dict[str, Any]
    paths: dict[str, Path] = field(default_factory=dict)


def score_folder(
    images: str | os.PathLike[str],
    *,
    out: str | os.PathLike[str],
    options: FolderOptions | None = None,
    **settings: Any,
) -> FolderResult:
    """Score every image of a folder (see :mod:`bayesurl.folder`).

    Parameters
    ----------
    images : path-like
        ``DIR/<class>/<image>`` (labelled) or ``DIR/<image>`` (unlabelled).
    out : path-like
        Folder for ``uncertainty.csv``, ``queries.npz`` and ``folder.json``.
    options : FolderOptions, optional
        The settings; default ``FolderOptions(**settings)``.
    **settings
        The fields of :class:`FolderOptions` (``method``, ``backbone``, ``epochs``, ...),
        when no ``options`` is given.

    Raises
    ------
    FileNotFoundError
        If ``images`` is not a folder.
    TypeError
        On a setting that is no field of :class:`FolderOptions`, or settings beside
        ``options``.
    ValueError
        On an unknown ``method`` / ``backbone``, bad sizes, a folder without readable images,
        or (``strict``) an unreadable image, naming it.
    """
    if options is not None and settings:
        raise TypeError(f"pass `options` or settings, not both (got {sorted(settings)})")
    opts = FolderOptions(**settings) if options is None else options
    t0 = time.perf_counter()
    enc = encode_folder(images, opts)
    scan, fx = enc.scan, enc.fx
    if FIT_PLANS[opts.method].crossfit:
        # the embedding is the feature itself; u of each fold from the other folds
        emb = fx.feats
        u, fit_report, fit_images = crossfit(
            opts.method,
            fx,
            enc.fit_ids,
            scan.labels is not None,
            enc.generator,
            opts.wrapper_options,
        )
    else:
        pairs = fit_pairs(opts.method, fx, enc.fit_ids)
        wrapped, fit_report = fit_wrapper(
            opts.method, pairs, epochs=opts.epochs, batch_size=opts.batch_size,
            lr=opts.lr, generator=enc.generator, wrapper_options=opts.wrapper_options,
        )  # fmt: skip
        with torch.no_grad():
            pred, _ = predict(
                lambda x, _s: wrapped(x), fx.feats, None, batch_size=1024, device=enc.device,
                seed=None,
            )  # fmt: skip
        emb, u = pred.embedding, pred.uncertainty
        fit_images = int(pairs.shape[0])
    labels = None if scan.labels is None else fx.labels
    meta = {"name": opts.method.value, "root": str(scan.root.resolve()),
            "paths": [scan.paths[i] for i in fx.ids.tolist()], "classes": scan.classes}  # fmt: skip
    rec = query_record(emb, u, labels, meta=meta, source=fx.digests)
    metrics = None
    if labels is not None and len(set(labels.tolist())) > 1:
        metrics = evaluate(emb, labels, uncertainties=u)
    skipped = [(scan.paths[i], err) for i, err in fx.skipped]
    info = folder_info(enc, opts, metrics, skipped, fit_report, fit_images)
    info["timings"] = {"encode": enc.seconds, "total": time.perf_counter() - t0}
    paths = write_outputs(out, enc, opts.method, info, rec, metrics)
    return FolderResult(rec, metrics, skipped, info, paths)
