"""Notes a person reads beside a result: what would otherwise be misread as a finding.

A table of R-AUROC values or a gallery of u scores looks the same whether the model learned
something or not. These rules, declared here once, say when it did not; every road takes its
notes from :func:`result_notes` (the Python result of :func:`bayesurl.evaluation.evaluate` as
its ``caveats``, ``bayesurl evaluate``, the ``bayesurl run`` / ``benchmark`` / ``folder``
tables, the HTML report, the folder's ``uncertainty.csv`` companion page):

- **u nearly constant** (``constant_u``): the spread of u is below
  :data:`NEARLY_CONSTANT_SPREAD` of its typical size, or u takes fewer than
  :data:`MIN_DISTINCT_U` distinct values. Its ranking then rests on a few digits (or on ties).
- **u at chance** (``chance_r_auroc``, ``chance_ood_auroc``, ``chance_mixed_r_auroc``): the
  interval of the AUROC (:mod:`bayesurl.stats.intervals`: DeLong's, 95 %) holds
  :data:`CHANCE_AUROC`: u does not tell the wrong retrievals from the right ones (or the OOD
  images from the in-distribution ones) beyond what the queries' noise allows.
- **u inverted** (``inverted_r_auroc``, ``inverted_ood_auroc``, ``inverted_mixed_r_auroc``):
  the AUROC's interval lies below 0.5. u then ranks the wrong retrievals (or the OOD images)
  as *more* certain.
- **model at chance** (``chance_r1``, ``chance_loss``): R@1 not above the R@1 of a random
  neighbour for these class counts (``sum_c n_c (n_c - 1) / (N (N - 1))``) beyond a binomial
  standard error at level :data:`ALPHA`; or the last training loss within
  :data:`CHANCE_LOSS_RTOL` of its untrained value (cross-entropy of a uniform softmax,
  ``ln C``).

:func:`u_digits` gives the significant digits that tell the printed u of two inputs apart.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

import numpy as np

from bayesurl.stats.intervals import DEFAULT_LEVEL, Interval, auroc_interval

__all__ = [
    "ALPHA",
    "AUROC_TITLES",
    "CHANCE_AUROC",
    "CHANCE_LOSS_RTOL",
    "NOTE_WORDS",
    "MIN_DISTINCT_U",
    "NEARLY_CONSTANT_SPREAD",
    "Note",
    "auroc_note",
    "chance_r1",
    "result_notes",
    "u_digits",
]

#: Relative spread ``(q99 - q01) / max(|median|, q99 - q01 scale)`` below which u is "nearly
#: constant" (the folder road's Laplace u spanned 0.3 %).
NEARLY_CONSTANT_SPREAD = 0.01
#: Fewer distinct u values than this (with more queries) is "nearly constant".
MIN_DISTINCT_U = 3
#: One-sided level of the R@1-at-chance test.
ALPHA = 0.01
#: Relative distance of the last training loss to its untrained value that counts as "at chance".
CHANCE_LOSS_RTOL = 0.02
#: The AUROC of a u that carries no information.
CHANCE_AUROC = 0.5
#: The AUROCs whose interval is read against chance, with their titles (in note order).
AUROC_TITLES = {"r_auroc": "R-AUROC", "ood_auroc": "OOD AUROC", "mixed_r_auroc": "mixed R-AUROC"}
#: What each AUROC's positives and negatives are, for its notes.
_AUROC_MEANING = {
    "r_auroc": ("the wrong retrievals", "the right ones"),
    "ood_auroc": ("the OOD images", "the in-distribution ones"),
    "mixed_r_auroc": ("the wrong retrievals of the mixed queries", "the right ones"),
}


#: What the brief words of the AUROC notes mean, said once under a list of them.
NOTE_WORDS = (
    "at chance: the AUROC's 95 % interval holds 0.5 (u does not tell the wrong retrievals, or "
    "the OOD images, from the rest beyond noise); inverted: it lies below 0.5 (u marks them as "
    "the more trustworthy)"
)


@dataclass(frozen=True)
class Note:
    """One note: a stable ``kind`` (for tests and filters), the sentence a person reads and
    its few words for a list of many (``brief``: ``"R-AUROC 0.505 [0.450, 0.560] at
    chance"``; the sentence when not given)."""

    kind: str
    text: str
    brief: str = ""

    @property
    def short(self) -> str:
        """:attr:`brief`, or the sentence."""
        return self.brief or self.text

    def __str__(self) -> str:
        return self.text


def _z(alpha: float) -> float:
    return NormalDist().inv_cdf(1.0 - alpha)


def _as_array(x: object) -> np.ndarray:
    if hasattr(x, "detach"):
        x = x.detach().cpu().double().numpy()  # type: ignore[union-attr]
    return np.asarray(x, dtype=np.float64).reshape(-1)


def _as_labels(x: object) -> np.ndarray:
    """Class labels as a flat array, a tensor on any device through the CPU."""
    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()  # type: ignore[union-attr]
    return np.asarray(x).reshape(-1)


def constant_u(u: object) -> Note | None:
    """The ``constant_u`` note, or ``None`` when u varies enough to rank inputs."""
    v = _as_array(u)
    v = v[np.isfinite(v)]
    if v.size < 2:
        return None
    distinct = np.unique(v).size
    lo, med, hi = np.quantile(v, [0.01, 0.5, 0.99])
    spread = float(hi - lo)
    scale = abs(float(med))
    rel = spread / scale if scale > 0 else (0.0 if spread == 0 else math.inf)
    if distinct < min(MIN_DISTINCT_U, v.size):
        what = "one value" if distinct == 1 else f"only {distinct} distinct values"
        return Note(
            "constant_u",
            f"u is nearly constant: it takes {what} over {v.size} inputs, so its ranking "
            "(R-AUROC, AUSC, the galleries) rests on ties",
            f"u nearly constant ({what})",
        )
    if rel < NEARLY_CONSTANT_SPREAD:
        d = u_digits(v)
        return Note(
            "constant_u",
            f"u is nearly constant: 98 % of it lies in {lo:.{d}g} to {hi:.{d}g} "
            f"({100 * rel:.2g} % of its median); rank by u, or read its percentile, not its value",
            f"u nearly constant ({100 * rel:.2g} % of its median)",
        )
    return None


def _bounds(iv: Interval, digits: int = 3) -> str:
    return f"[{iv.low:.{digits}f}, {iv.high:.{digits}f}]"


def auroc_note(
    key: str, estimate: float | None, interval: Interval | None, detail: str = ""
) -> Note | None:
    """The ``chance_<key>`` note where the AUROC's interval holds 0.5, ``inverted_<key>``
    where it lies below 0.5, else ``None`` (also without an estimate or an interval).

    ``key`` is one of :data:`AUROC_TITLES` (``"r_auroc"``, ``"ood_auroc"``,
    ``"mixed_r_auroc"``); ``detail`` is added to the interval's description (``"28 of them
    wrong"``).
    """
    if estimate is None or interval is None:
        return None
    title = AUROC_TITLES[key]
    pos, neg = _AUROC_MEANING[key]
    how = interval.describe() + (f", {detail}" if detail else "")
    told = f"{title} {float(estimate):.3f} {_bounds(interval)} ({how})"
    if interval.high < CHANCE_AUROC:
        return Note(
            f"inverted_{key}",
            f"u is inverted: {told} lies below 0.5: {pos} get lower u than {neg}, so u marks "
            "them as the more trustworthy",
            f"{title} {float(estimate):.3f} {_bounds(interval)} inverted",
        )
    if interval.contains(CHANCE_AUROC):
        return Note(
            f"chance_{key}",
            f"u is at chance: {told} holds 0.5: u does not tell {pos} from {neg} beyond noise",
            f"{title} {float(estimate):.3f} {_bounds(interval)} at chance",
        )
    return None


def _auroc_of(
    pos: np.ndarray, neg: np.ndarray, level: float, over: str
) -> tuple[float | None, Interval | None]:
    """DeLong's AUROC and interval of ``pos`` against ``neg`` (``None`` with an empty side)."""
    if pos.size < 1 or neg.size < 1:
        return None, None
    a, lo, hi = auroc_interval(pos, neg, level)
    return a, Interval(lo, hi, level, "delong", int(pos.size + neg.size), over)


def chance_r1(hit: object, labels: object) -> tuple[float, float]:
    """``(r1, chance)``: R@1 of the hit flags and the R@1 of a random other query.

    ``chance = sum_c n_c (n_c - 1) / (N (N - 1))`` for the class counts ``n_c`` of ``labels``.
    """
    h = _as_array(hit)
    y = _as_labels(labels)
    n = y.size
    if n < 2 or h.size != n:
        raise ValueError(f"`hit` and `labels` need the same length >= 2, got {h.size}, {n}")
    counts = np.unique(y, return_counts=True)[1].astype(np.float64)
    return float(h.mean()), float((counts * (counts - 1)).sum() / (n * (n - 1)))


def _chance_r1_note(hit: object, labels: object) -> Note | None:
    r1, p = chance_r1(hit, labels)
    n = _as_labels(labels).size
    se = math.sqrt(max(p * (1 - p), 1e-12) / n)
    if r1 <= p + _z(ALPHA) * se:
        return Note(
            "chance_r1",
            f"model at chance: R@1 {r1:.3f} is not above the {p:.3f} of a random neighbour "
            f"for these class counts ({n} queries); the embedding has learned nothing usable",
            f"model at chance (R@1 {r1:.3f}, a random neighbour's {p:.3f})",
        )
    return None


def _chance_loss_note(final_loss: float, untrained_loss: float) -> Note | None:
    if not (math.isfinite(final_loss) and math.isfinite(untrained_loss)) or untrained_loss <= 0:
        return None
    if final_loss >= (1.0 - CHANCE_LOSS_RTOL) * untrained_loss:
        return Note(
            "chance_loss",
            f"model at chance: the last training loss {final_loss:.4g} is at its untrained "
            f"value {untrained_loss:.4g} (a uniform softmax); u and R@1 describe an untrained "
            "model",
            f"model at chance (loss {final_loss:.4g} = untrained {untrained_loss:.4g})",
        )
    return None


def result_notes(
    u: object,
    *,
    hit: object | None = None,
    labels: object | None = None,
    ood_u: object | None = None,
    id_u: object | None = None,
    final_loss: float | None = None,
    untrained_loss: float | None = None,
    intervals: Mapping[str, Interval] | None = None,
    estimates: Mapping[str, Any] | None = None,
    level: float = DEFAULT_LEVEL,
) -> list[Note]:
    """Every note that applies to one result (see the module docs for the rules).

    Parameters
    ----------
    u : array-like
        ``[N]`` u of the queries (higher = less certain).
    hit : array-like, optional
        ``[N]`` whether each query's nearest neighbour shares its class (R@1's hits); with it,
        R-AUROC (u of the wrong retrievals against the right ones) is read against chance.
    labels : array-like, optional
        ``[N]`` query classes; with ``hit``, R@1 is compared with chance.
    ood_u, id_u : array-like, optional
        u of the OOD images and of the in-distribution reference (``None`` or empty: the
        queries' u); with ``ood_u``, OOD AUROC is read against chance.
    final_loss, untrained_loss : float, optional
        The last training loss and its untrained value (``ln C`` for a softmax
        cross-entropy), both given: the loss is compared with it.
    intervals, estimates : mapping, optional
        An evaluation's intervals and values (``res["intervals"]`` and ``res``): an AUROC of
        :data:`AUROC_TITLES` found in both is read from them (the mixed R-AUROC only so); one
        that is ``None`` in ``estimates`` (undefined) gets no note; otherwise it is computed
        from ``u`` / ``hit`` / ``ood_u`` with DeLong's interval at ``level``.
    level : float
        Level of the intervals computed here.

    Returns
    -------
    list of Note
        In the order constant u, R-AUROC, OOD AUROC, mixed R-AUROC (at chance or inverted),
        chance R@1, chance loss.
    """
    uu = _as_array(u)
    notes: list[Note | None] = [constant_u(uu)]
    given_iv = dict(intervals or {})
    given_est = dict(estimates or {})
    found: dict[str, tuple[float | None, Interval | None]] = {}
    for key in AUROC_TITLES:
        if key in given_iv and given_est.get(key) is not None:
            found[key] = (float(given_est[key]), given_iv[key])
        elif key in given_est and given_est[key] is None:
            found[key] = (None, None)  # undefined in that result: no note
    if hit is not None:
        h = _as_array(hit).astype(bool)
        if h.size != uu.size:
            raise ValueError(f"`hit` has {h.size} entries, `u` {uu.size}")
        if "r_auroc" not in found:
            found["r_auroc"] = _auroc_of(uu[~h], uu[h], level, "queries")
    if ood_u is not None and _as_array(ood_u).size and "ood_auroc" not in found:
        has_id = id_u is not None and _as_array(id_u).size
        ref = _as_array(id_u) if has_id else uu
        over = "held-out and OOD inputs" if has_id else "queries and OOD inputs"
        found["ood_auroc"] = _auroc_of(_as_array(ood_u), ref, level, over)
    detail = {}
    if hit is not None:  # how many errors an R-AUROC rests on (its interval needs some 30)
        wrong = int((~_as_array(hit).astype(bool)).sum())
        detail["r_auroc"] = f"{wrong} of them wrong"
    notes += [
        auroc_note(key, *found[key], detail.get(key, "")) for key in AUROC_TITLES if key in found
    ]
    if hit is not None and labels is not None:
        notes.append(_chance_r1_note(hit, labels))
    if final_loss is not None and untrained_loss is not None:
        notes.append(_chance_loss_note(float(final_loss), float(untrained_loss)))
    return [n for n in notes if n is not None]


def u_digits(u: object, *, minimum: int = 3, maximum: int = 8) -> int:
    """Significant digits that tell the printed u of typical inputs apart.

    Enough that the gap between the 5th and 95th percentile of ``u``, divided into 100
    steps, shows in the last printed digit of its largest value: ``u`` from 0.013622 to
    0.013662 needs 6 digits (``0.0136220`` vs ``0.0136620``), not the 3 of ``0.0136``.
    """
    v = _as_array(u)
    v = v[np.isfinite(v)]
    if v.size < 2:
        return minimum
    lo, hi = np.quantile(v, [0.05, 0.95])
    top = float(np.max(np.abs(v)))
    step = float(hi - lo) / 100.0
    if top == 0 or step <= 0:
        return minimum
    need = math.floor(math.log10(top)) - math.floor(math.log10(step)) + 1
    return int(min(max(need, minimum), maximum))
