"""The per-query record of a run: what a person needs to look at its uncertainties.

The metrics of a run are means over its queries; to see *which* images the model does not
trust, and whether it is right not to, the report (:mod:`bayesurl.report`) needs, per
downstream query, its u, its nearest neighbour (cosine, self excluded: the R@1 search of
docs/concepts/metrics.rst) and whether that neighbour shares its class, and, per OOD image, its u.
This module turns a run's predicted outputs into that record and keeps it beside the run's results
as one compressed ``.npz`` (a few bytes per query; no embeddings). The record also carries
what the per-query tests of the displays need (:func:`paired_test`: two estimators on the
same queries, resampled jointly): each query's hit and AP@5, u, and the OOD images' u.
Images are not stored: the report reads them from the data set by id (the record keeps the
data settings that rebuild it) or, for a folder of one's own images, from the file paths kept
in the record. Each query and OOD
image is also named by the SHA-1 digest of its pixels (its first 8 bytes, :func:`source_ids`;
for cached features the digest the feature store keeps per row,
:class:`bayesurl.features.CachedFeatures`), so the report shows the very image the
run scored and says so in words where the rebuilt data differ.
"""

from __future__ import annotations

import json
import os
import zipfile
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from torch import Tensor

from bayesurl.evaluation import functional as Fm
from bayesurl.evaluation.notes import Note, result_notes
from bayesurl.files import atomic_open
from bayesurl.search import knn
from bayesurl.stats.intervals import (
    DEFAULT_LEVEL,
    Interval,
    paired_bootstrap,
    weighted_auroc,
    weighted_mean,
    weighted_sparsification,
)

__all__ = [
    "PAIRED_KEYS",
    "QUERIES_FILE",
    "QueryRecord",
    "paired_test",
    "query_record",
    "read_queries",
    "record_from_outputs",
    "source_ids",
]

#: File name of a single run's record (``bayesurl run``); a sweep keeps one per run under
#: ``queries/<estimator>_s<seed>.npz``.
QUERIES_FILE = "queries.npz"


@dataclass
class QueryRecord:
    """Per-query outputs of one run.

    Attributes
    ----------
    u : ndarray
        ``[N]`` float32 uncertainty of every downstream query (higher = less certain).
    label : ndarray
        ``[N]`` int64 class of every query (``-1``: unlabelled folder image).
    neighbour : ndarray
        ``[N]`` int64 index of the query's nearest neighbour among the other queries.
    hit : ndarray
        ``[N]`` bool, neighbour shares the query's class (all False without labels).
    ood_u, id_u : ndarray
        u of the OOD images and of the held-out upstream images (empty when absent).
    source, ood_source : ndarray
        ``uint64`` id of the image of every query / OOD image (:func:`source_ids`; empty when
        the run did not know them, e.g. records written before they were kept).
    ap : ndarray
        ``[N]`` float32 AP@5 of every query (``map@5`` is their mean; empty when the search
        kept fewer than 5 neighbours or the queries have no labels).
    meta : dict
        ``name`` (estimator), ``seed``, ``config`` (the run's data / backbone settings,
        to rebuild the images) or ``paths`` / ``classes`` (a folder), ``labelled``, and
        ``fit`` (``final_loss`` and ``untrained_loss`` where the training reported them).
    """

    u: np.ndarray
    label: np.ndarray
    neighbour: np.ndarray
    hit: np.ndarray
    ood_u: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))
    id_u: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))
    meta: dict[str, Any] = field(default_factory=dict)
    source: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint64))
    ood_source: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint64))
    ap: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))

    @property
    def labelled(self) -> bool:
        """Whether the queries carry classes (R@1 and the right / wrong marks are defined)."""
        return bool(self.meta.get("labelled", bool((self.label >= 0).all())))

    def notes(
        self,
        intervals: dict[str, Interval] | None = None,
        estimates: dict[str, Any] | None = None,
    ) -> list[Note]:
        """The notes a person reads beside this run: u nearly constant, an AUROC at chance or
        inverted by its interval, the model at chance
        (:func:`bayesurl.evaluation.notes.result_notes`). ``intervals`` / ``estimates``: the
        run's metrics, whose intervals are read where they have them (the mixed R-AUROC only
        so); R-AUROC and OOD AUROC otherwise from the record."""
        fit = self.meta.get("fit") or {}
        labelled = self.labelled
        return result_notes(
            self.u,
            hit=self.hit if labelled else None,
            labels=self.label if labelled else None,
            ood_u=self.ood_u,
            id_u=self.id_u,
            final_loss=fit.get("final_loss"),
            untrained_loss=fit.get("untrained_loss"),
            intervals=intervals,
            estimates=estimates,
        )

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the record as one compressed ``.npz`` (``meta`` as a JSON string)."""
        p = Path(path)
        if p.suffix != ".npz":  # numpy's rule for a file name
            p = p.with_name(p.name + ".npz")
        with atomic_open(p, "wb") as fh:
            np.savez_compressed(
                fh,
                u=self.u.astype(np.float32),
                label=self.label.astype(np.int64),
                neighbour=self.neighbour.astype(np.int64),
                hit=self.hit.astype(bool),
                ood_u=self.ood_u.astype(np.float32),
                id_u=self.id_u.astype(np.float32),
                meta=np.array(json.dumps(self.meta, default=str)),
                source=self.source.astype(np.uint64),
                ood_source=self.ood_source.astype(np.uint64),
                ap=self.ap.astype(np.float32),
            )
        return p


def source_ids(digests: Sequence[str] | None) -> np.ndarray:
    """``uint64`` ids of images from their SHA-1 hex digests (the first 8 bytes, big-endian).

    ``None`` gives an empty array (no ids known).
    """
    if digests is None:
        return np.zeros(0, np.uint64)
    return np.array([int(d[:16], 16) for d in digests], dtype=np.uint64)


def _numpy(t: Tensor | None) -> np.ndarray:
    if t is None:
        return np.zeros(0, np.float32)
    return t.detach().float().cpu().numpy().reshape(-1)


def query_record(
    embedding: Tensor,
    uncertainty: Tensor,
    labels: Tensor | None,
    *,
    ood_u: Tensor | None = None,
    id_u: Tensor | None = None,
    meta: dict[str, Any] | None = None,
    neighbors: Tensor | None = None,
    source: Sequence[str] | None = None,
    ood_source: Sequence[str] | None = None,
) -> QueryRecord:
    """The record of one run's queries: u, nearest neighbour, hit flag (docs/concepts/metrics.rst,
    "Recall@1 and Recall@k").

    Parameters
    ----------
    embedding : Tensor
        ``[N, D]`` point embeddings of the queries (``N >= 2``).
    uncertainty : Tensor
        ``[N]`` u of the queries.
    labels : Tensor or None
        ``[N]`` classes; ``None`` for unlabelled images (no hit flags).
    ood_u, id_u : Tensor, optional
        u of the OOD and held-out upstream images.
    meta : dict, optional
        What rebuilds the images and names the run (see :class:`QueryRecord`).
    neighbors : Tensor, optional
        ``[N, k]`` neighbour ids of the queries from a search already made (the evaluator's,
        self excluded, nearest first); ``None``: searched here.
    source, ood_source : sequence of str, optional
        SHA-1 hex digests of the query / OOD images
        (:func:`bayesurl.features.source_digests`), kept as :func:`source_ids`.

    Raises
    ------
    ValueError
        On fewer than two queries or a length mismatch (naming the argument).
    """
    if embedding.ndim != 2 or embedding.shape[0] < 2:
        raise ValueError(
            f"`embedding` must be [N, D] with N >= 2, got shape {tuple(embedding.shape)}"
        )
    n = embedding.shape[0]
    if uncertainty.reshape(-1).shape[0] != n:
        raise ValueError(
            f"length mismatch: `uncertainty` has {uncertainty.numel()} entries, not {n}"
        )
    if labels is not None and labels.reshape(-1).shape[0] != n:
        raise ValueError(f"length mismatch: `labels` has {labels.numel()} entries, not {n}")
    if neighbors is None:
        _, neighbors = knn(embedding.detach(), 1)
    elif neighbors.ndim != 2 or neighbors.shape[0] != n or neighbors.shape[1] < 1:
        raise ValueError(
            f"`neighbors` must be [{n}, k >= 1] neighbour ids, got shape {tuple(neighbors.shape)}"
        )
    neighbour = neighbors[:, 0].cpu().numpy().astype(np.int64)
    ap = np.zeros(0, np.float32)
    if labels is None:
        label = np.full(n, -1, np.int64)
        hit = np.zeros(n, bool)
    else:
        label = labels.detach().cpu().numpy().astype(np.int64).reshape(-1)
        hit = label[neighbour] == label
        if neighbors.shape[1] >= 5:  # each query's AP@5 (docs/concepts/metrics.rst, mAP@k)
            y = labels.detach().cpu().reshape(-1)
            nb = neighbors[:, :5].cpu().long()
            ap = Fm.ap_from_hits(y[nb] == y[:, None], Fm.class_mates(y), 5).float().numpy()
    info = dict(meta or {})
    info.setdefault("labelled", labels is not None)
    ood = _numpy(ood_u)
    for name, ids, size in (("source", source, n), ("ood_source", ood_source, ood.size)):
        if ids is not None and len(ids) != size:
            raise ValueError(f"length mismatch: `{name}` has {len(ids)} entries, not {size}")
    return QueryRecord(
        _numpy(uncertainty), label, neighbour, hit, ood, _numpy(id_u), info,
        source_ids(source), source_ids(ood_source), ap,
    )  # fmt: skip


def record_from_outputs(
    outputs: dict[str, tuple[Any, Tensor]],
    meta: dict[str, Any],
    *,
    source: Sequence[str] | None = None,
    ood_source: Sequence[str] | None = None,
) -> QueryRecord | None:
    """:func:`query_record` of the ``outputs`` a run keeps (``score(return_outputs=True)``).

    ``source`` / ``ood_source``: digests of the test / OOD images (as for
    :func:`query_record`). ``None`` when the estimator gives no u (nothing to rank).
    """
    out, y = outputs["test"]
    if out.uncertainty is None:
        return None
    ood = outputs.get("ood")
    idt = outputs.get("id_test")
    return query_record(
        out.embedding.float(),
        out.uncertainty,
        y,
        ood_u=None if ood is None else ood[0].uncertainty,
        id_u=None if idt is None else idt[0].uncertainty,
        meta=meta,
        neighbors=outputs.get("test_neighbors"),
        source=source,
        ood_source=None if ood is None else ood_source,
    )


def read_queries(path: str | os.PathLike[str]) -> QueryRecord:
    """Load a record written by :meth:`QueryRecord.save`.

    Raises
    ------
    FileNotFoundError
        If ``path`` does not exist.
    ValueError
        If it is not a query record (naming ``path``).
    """
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"query record {str(p)!r} does not exist")
    try:
        with np.load(p, allow_pickle=False) as z:
            rec = QueryRecord(
                u=z["u"],
                label=z["label"],
                neighbour=z["neighbour"],
                hit=z["hit"],
                ood_u=z["ood_u"],
                id_u=z["id_u"],
                meta=json.loads(str(z["meta"])),
                # records written before the images' ids were kept have none
                source=z["source"] if "source" in z.files else np.zeros(0, np.uint64),
                ood_source=z["ood_source"] if "ood_source" in z.files else np.zeros(0, np.uint64),
                ap=z["ap"] if "ap" in z.files else np.zeros(0, np.float32),
            )
    except (KeyError, ValueError, OSError, EOFError, zipfile.BadZipFile, zlib.error) as exc:
        # a truncated or foreign file: numpy's and zipfile's errors do not name it
        what = " ".join(str(exc).split()) or type(exc).__name__
        raise ValueError(
            f"{str(p)!r} is not a readable bayesurl query record ({type(exc).__name__}: {what}; "
            "truncated, or another kind of file)"
        ) from None
    n = rec.u.shape[0]
    if (
        not (rec.label.shape[0] == rec.neighbour.shape[0] == rec.hit.shape[0] == n)
        or (n and (rec.neighbour.min() < 0 or rec.neighbour.max() >= n))
        or rec.source.size not in (0, n)
        or rec.ood_source.size not in (0, rec.ood_u.size)
        or rec.ap.size not in (0, n)
    ):
        raise ValueError(f"{str(p)!r} is not a consistent query record (array lengths / ids)")
    return rec


#: The metrics :func:`paired_test` can recompute from two records.
PAIRED_KEYS = ("r@1", "r_auroc", "ausc", "ood_auroc", "map@5")


def _statistic(rec: QueryRecord, key: str) -> Any:
    """``[w_queries, w_ood, w_id] -> values`` of ``key`` on the weighted units of ``rec``
    (``None`` where the record cannot give it)."""
    labelled = rec.labelled
    if key == "r@1" and labelled:
        f = weighted_mean(rec.hit.astype(np.float64))
        return lambda w: f(w[0])
    if key == "map@5" and labelled and rec.ap.size:
        f = weighted_mean(rec.ap.astype(np.float64))
        return lambda w: f(w[0])
    if key == "r_auroc" and labelled and 0 < rec.hit.sum() < rec.hit.size:
        f = weighted_auroc(rec.u, ~rec.hit)
        return lambda w: f(w[0])
    if key == "ausc" and labelled:
        g = weighted_sparsification(rec.u, rec.hit)
        return lambda w: g(w[0])["ausc"]
    if key == "ood_auroc" and rec.ood_u.size:
        inside = rec.id_u if rec.id_u.size else rec.u
        scores = np.concatenate([inside, rec.ood_u]).astype(np.float64)
        is_ood = np.concatenate([np.zeros(inside.size, bool), np.ones(rec.ood_u.size, bool)])
        f = weighted_auroc(scores, is_ood)
        if rec.id_u.size:  # the held-out images and the OOD images, each resampled
            return lambda w: f(np.concatenate([w[2], w[1]], axis=1))
        return lambda w: f(np.concatenate([w[0], w[1]], axis=1))
    return None


def paired_test(
    a: QueryRecord,
    b: QueryRecord,
    key: str,
    *,
    level: float = DEFAULT_LEVEL,
    replicates: int = 1000,
    seed: int = 0,
) -> dict[str, Any] | None:
    """``key`` of run ``a`` minus that of run ``b`` on the same queries, by a paired Poisson
    bootstrap (:func:`bayesurl.stats.intervals.paired_bootstrap`): the queries (and the
    OOD and held-out images) are resampled jointly and both metrics recomputed, so the
    difference's interval accounts for the two estimators' errors being different but
    correlated (DeLong's test of two AUROCs on one labelling does not apply: each estimator
    has its own right / wrong queries).

    Returns
    -------
    dict or None
        As :func:`~bayesurl.stats.intervals.paired_bootstrap` plus ``n`` (queries), or
        ``None`` when the records do not describe the same queries (count, classes, OOD
        count) or cannot give ``key`` (:data:`PAIRED_KEYS`).
    """
    same = (
        a.u.size == b.u.size
        and np.array_equal(a.label, b.label)
        and a.ood_u.size == b.ood_u.size
        and a.id_u.size == b.id_u.size
    )
    fa, fb = _statistic(a, key), _statistic(b, key)
    if not same or fa is None or fb is None:
        return None
    sizes = [a.u.size, a.ood_u.size, a.id_u.size]
    out = paired_bootstrap(fa, fb, sizes, level=level, replicates=replicates, seed=seed)
    return {**out, "n": int(a.u.size)}
