"""Notes a person reads beside a result: what would otherwise be misread as a finding.

A table of R-AUROC values or a gallery of u scores looks the same whether the model learned
something or not. These rules, declared here once, say when it did not; every display (the
``bayesurl run`` / ``benchmark`` / ``folder`` tables, the HTML report, the folder's
``uncertainty.csv`` companion page) takes its notes from :func:`result_notes`:

- **u nearly constant** (``constant_u``): the spread of u is below
  :data:`NEARLY_CONSTANT_SPREAD` of its typical size, or u takes fewer than
  :data:`MIN_DISTINCT_U` distinct values. Its ranking then rests on a few digits (or on ties).
- **u inverted** (``inverted_r_auroc``, ``inverted_ood_auroc``): an AUROC below 0.5 beyond
  noise, by the one-sided Mann-Whitney test of ``AUROC = 0.5`` (Hanley & McNeil 1982: under
  the null, ``SE = sqrt((n1 + n2 + 1) / (12 n1 n2))``), at level :data:`ALPHA`. u then ranks
  the wrong retrievals (or the OOD images) as *more* certain.
- **model at chance** (``chance_r1``, ``chance_loss``): R@1 not above the R@1 of a random
  neighbour for these class counts (``sum_c n_c (n_c - 1) / (N (N - 1))``) beyond a binomial
  standard error at level :data:`ALPHA`; or the last training loss within
  :data:`CHANCE_LOSS_RTOL` of its untrained value (cross-entropy of a uniform softmax,
  ``ln C``).

:func:`u_digits` gives the significant digits that tell the printed u of two inputs apart.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

__all__ = [
    "ALPHA",
    "CHANCE_LOSS_RTOL",
    "MIN_DISTINCT_U",
    "NEARLY_CONSTANT_SPREAD",
    "Note",
    "auroc_null_z",
    "chance_r1",
    "result_notes",
    "u_digits",
]

#: Relative spread ``(q99 - q01) / max(|median|, q99 - q01 scale)`` below which u is "nearly
#: constant" (the folder road's Laplace u spanned 0.3 %).
NEARLY_CONSTANT_SPREAD = 0.01
#: Fewer distinct u values than this (with more queries) is "nearly constant".
MIN_DISTINCT_U = 3
#: One-sided level of the inverted-AUROC and the R@1-at-chance tests.
ALPHA = 0.01
#: Relative distance of the last training loss to its untrained value that counts as "at chance".
CHANCE_LOSS_RTOL = 0.02


@dataclass(frozen=True)
class Note:
    """One note: a stable ``kind`` (for tests and filters) and the sentence a person reads."""

    kind: str
    text: str

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
        )
    if rel < NEARLY_CONSTANT_SPREAD:
        d = u_digits(v)
        return Note(
            "constant_u",
            f"u is nearly constant: 98 % of it lies in {lo:.{d}g} to {hi:.{d}g} "
            f"({100 * rel:.2g} % of its median); rank by u, or read its percentile, not its value",
        )
    return None


def auroc_null_z(auroc: float, n_pos: int, n_neg: int) -> float:
    """``(auroc - 0.5) / SE0``, SE0 the Mann-Whitney standard error of an AUROC of 0.5.

    ``SE0 = sqrt((n_pos + n_neg + 1) / (12 n_pos n_neg))`` (Hanley & McNeil 1982, no ties).
    """
    if n_pos < 1 or n_neg < 1:
        raise ValueError(f"`n_pos` and `n_neg` must be >= 1, got {n_pos}, {n_neg}")
    se = math.sqrt((n_pos + n_neg + 1) / (12.0 * n_pos * n_neg))
    return (float(auroc) - 0.5) / se


def _auroc(pos: np.ndarray, neg: np.ndarray) -> float:
    """P(u_pos > u_neg) + P(tie) / 2 by midranks (the Mann-Whitney statistic)."""
    from scipy.stats import rankdata

    r = rankdata(np.concatenate([pos, neg]))
    n1, n2 = pos.size, neg.size
    return float((r[:n1].sum() - n1 * (n1 + 1) / 2) / (n1 * n2))


def inverted(name: str, label: str, pos: object, neg: object) -> Note | None:
    """The ``inverted_<name>`` note when u ranks ``pos`` *below* ``neg`` beyond noise."""
    p, n = _as_array(pos), _as_array(neg)
    if p.size < 1 or n.size < 1:
        return None
    a = _auroc(p, n)
    z = auroc_null_z(a, p.size, n.size)
    if z < -_z(ALPHA):
        return Note(
            f"inverted_{name}",
            f"u is inverted: {label} {a:.3f} is below 0.5 beyond noise (z = {z:.1f}, "
            f"{p.size} vs {n.size} inputs): higher u marks the more trustworthy ones",
        )
    return None


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
) -> list[Note]:
    """Every note that applies to one result (see the module docs for the rules).

    Parameters
    ----------
    u : array-like
        ``[N]`` u of the queries (higher = less certain).
    hit : array-like, optional
        ``[N]`` whether each query's nearest neighbour shares its class (R@1's hits); with it,
        R-AUROC (u of the wrong retrievals against the right ones) is tested for inversion.
    labels : array-like, optional
        ``[N]`` query classes; with ``hit``, R@1 is compared with chance.
    ood_u, id_u : array-like, optional
        u of the OOD images and of the in-distribution reference (``None`` or empty: the
        queries' u); with ``ood_u``, OOD AUROC is tested for inversion.
    final_loss, untrained_loss : float, optional
        The last training loss and its untrained value (``ln C`` for a softmax
        cross-entropy), both given: the loss is compared with it.

    Returns
    -------
    list of Note
        In the order constant u, inverted R-AUROC, inverted OOD AUROC, chance R@1, chance loss.
    """
    uu = _as_array(u)
    notes: list[Note | None] = [constant_u(uu)]
    if hit is not None:
        h = _as_array(hit).astype(bool)
        if h.size != uu.size:
            raise ValueError(f"`hit` has {h.size} entries, `u` {uu.size}")
        notes.append(inverted("r_auroc", "R-AUROC", uu[~h], uu[h]))
    if ood_u is not None and _as_array(ood_u).size:
        ref = uu if id_u is None or not _as_array(id_u).size else _as_array(id_u)
        notes.append(inverted("ood_auroc", "OOD AUROC", ood_u, ref))
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
