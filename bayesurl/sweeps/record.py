"""The record of one run of a sweep: what it was, what it measured, its training curves.

:class:`RunRecord` is made once per run (:class:`bayesurl.sweeps.pipeline.PipelineRun`) and
stored as a flat row (:meth:`RunRecord.to_row`: the sweep storage, ``results.json``,
``results.csv``); :meth:`RunRecord.from_row` reads such a row back, rows written before the
estimator's name was stored as ``estimator`` included. :func:`run_rows` gives the rows every
report and aggregate reads: one shape, ``estimator`` always set.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

__all__ = ["CURVES", "RunRecord", "estimator_of", "run_rows"]

#: The per-epoch series a run records (training loss; median ``u`` of a fixed training batch).
CURVES: tuple[str, ...] = ("loss_curve", "u_curve")

#: Keys a row spells out as :class:`RunRecord` fields (``method``: the estimator's name in rows
#: stored before it was called ``estimator``).
_FIELDS = ("estimator", "method", "split", "seed", "error")


@dataclass(frozen=True)
class RunRecord:
    """One finished (or failed) run of a sweep.

    Attributes
    ----------
    estimator : str
        The estimator's name (a recipe name, e.g. ``"ce"``, ``"feature_knn"``).
    seed : int
        The run's seed.
    split : int
        The class split (0 on the standard split).
    error : str or None
        The exception text of a failed run (its metrics are then ``None``).
    values : mapping
        Everything else the run measured and ran with, in the order it was recorded: the
        metrics with their interval fields (:mod:`bayesurl.stats.intervals`), times,
        ``stage``, the class split's ``upstream`` / ``downstream``, ``overrides``,
        ``tuned_on`` and the training curves (:data:`CURVES`).
    """

    estimator: str
    seed: int
    split: int = 0
    error: str | None = None
    values: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.estimator, str) or not self.estimator:
            raise ValueError(f"a run record needs an estimator name, got {self.estimator!r}")
        clash = sorted(set(self.values) & set(_FIELDS))
        if clash:
            raise ValueError(f"`values` of a run record must not hold {clash}")
        object.__setattr__(self, "values", MappingProxyType(dict(self.values)))

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> RunRecord:
        """The record of a stored row (the one reader of the rows that name the estimator
        ``method``).

        Raises
        ------
        ValueError
            If the row names no estimator.
        """
        if not isinstance(row, Mapping):
            raise ValueError(f"a run record must be a mapping, got {type(row).__name__}")
        name = estimator_of(row)
        rest = {k: v for k, v in row.items() if k not in _FIELDS}
        return cls(
            estimator=name,
            seed=row.get("seed"),  # type: ignore[arg-type]  # checked where it is used
            split=row.get("split", 0),
            error=row.get("error"),
            values=rest,
        )

    def to_row(self, *, curves: bool = True) -> dict[str, Any]:
        """The flat row: ``estimator``, ``split``, ``seed``, ``error``, then :attr:`values`
        (without the training curves when ``curves`` is false)."""
        rest = self.values if curves else {k: v for k, v in self.values.items() if k not in CURVES}
        return {
            "estimator": self.estimator,
            "split": self.split,
            "seed": self.seed,
            "error": self.error,
            **rest,
        }

    @property
    def ok(self) -> bool:
        """Whether the run finished without an error."""
        return self.error is None

    def curves(self) -> dict[str, list[float] | None]:
        """The training curves (:data:`CURVES`; ``None`` where not recorded)."""
        return {k: self.values.get(k) for k in CURVES}


def estimator_of(row: Mapping[str, Any]) -> str:
    """The estimator's name in a stored row: ``estimator``, or ``method`` in the rows stored
    before it was called so (the one place that reads that key).

    Raises
    ------
    ValueError
        If the row names no estimator.
    """
    name = row.get("estimator", row.get("method"))
    if name is None:
        raise ValueError(f"a record in `records` has neither 'estimator' nor 'method': {row!r}")
    return str(name)


def run_rows(records: Iterable[Mapping[str, Any] | RunRecord]) -> list[dict[str, Any]]:
    """``records`` (rows or :class:`RunRecord`) as rows of one shape (:meth:`RunRecord.to_row`)."""
    return [(r if isinstance(r, RunRecord) else RunRecord.from_row(r)).to_row() for r in records]
