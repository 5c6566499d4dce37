"""The in-memory result of a sweep: its run records and settings.

:class:`SweepResults` holds the flat records of :meth:`bayesurl.runs.runner.RunResult.record`
and the sweep's settings; its table, files and plot are the one sweep report of
:mod:`bayesurl.sweeps.report` (the standard split being K = 1 split), and
:func:`merge_results` combines sweeps made separately (e.g. one seed per machine).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bayesurl.sweeps.record import estimator_of
from bayesurl.sweeps.report import (
    format_stat,
    observation_unit,
    plot_over,
    plot_results,
    read_results,
    results_table,
    save_results,
    summarize_runs,
)

__all__ = ["SweepResults", "format_stat", "merge_results"]


@dataclass
class SweepResults:
    """Everything a sweep (:func:`bayesurl.sweeps.sweep.run_sweep`) measured.

    Attributes
    ----------
    runs : list of dict
        One record per (estimator, seed): ``estimator``, ``seed``, every metric of
        :func:`bayesurl.runs.predict.score`, ``train_time`` (wall seconds),
        ``train_cpu_time`` (process CPU seconds, all threads), ``final_loss``, ``steps``,
        ``error`` (``None`` or the exception text of a failed run; its metrics are then
        ``None``).
    settings : dict
        Preset, recipes, data sizes, device, ``world_size`` (processes of a ``torchrun``
        sweep), versions, total wall time.
    main_process : bool
        False on the ranks other than 0 of a ``torchrun`` sweep (they neither write nor
        report; not serialised).
    status : dict or None
        Counts of the sweep's plan (``waiting``, ``running``, ``complete``, ``failed``,
        ``total``; ``None`` on the ranks other than 0 of a stored sweep under torchrun).
    done_here : int
        Runs this process finished.
    paths : dict
        Files written (empty until every run of the plan is finished).
    document : dict or None
        The results document written (:func:`~bayesurl.sweeps.report.results_document`:
        summary, best marks, comparisons), kept so that what is shown next is made from it,
        not read back; ``None`` until written.
    """

    runs: list[dict[str, Any]]
    settings: dict[str, Any]
    main_process: bool = field(default=True, repr=False, compare=False)
    status: dict[str, int] | None = field(default=None, repr=False, compare=False)
    done_here: int = field(default=0, repr=False, compare=False)
    paths: dict[str, str] = field(default_factory=dict, repr=False, compare=False)
    document: dict[str, Any] | None = field(default=None, repr=False, compare=False)

    @property
    def estimators(self) -> list[str]:
        """Method names in run order."""
        return list(dict.fromkeys(estimator_of(r) for r in self.runs))

    def summary(self) -> dict[str, dict[str, dict[str, Any]]]:
        """``{estimator: {column: {"mean", "low", "high", "sd", "n", "n_runs"}, "_runs":
        {"ok", "failed"}}}`` (:func:`~bayesurl.sweeps.report.summarize_runs`).

        Over the seeds on the standard split (sd with ddof 1, ``None`` with a single seed),
        over the class splits' seed means otherwise. A column that is ``None`` in every run
        (the ECE of an estimator without a distribution) has ``mean = None`` and ``n = 0``.
        """
        return summarize_runs(self.runs)

    def table(self) -> str:
        """The benchmark table (:func:`~bayesurl.sweeps.report.results_table`), its marks
        those of the results written (tested on the per-query records beside them)."""
        best = None if self.document is None else self.document.get("best")
        return results_table(self.runs, self.settings, queries=self.queries_folder(), best=best)

    def queries_folder(self) -> Path | None:
        """The folder of the runs' per-query records (``None`` before the results are
        written)."""
        where = self.paths.get("json")
        return None if where is None else Path(where).parent / "queries"

    def plot(self, path: str | os.PathLike[str]) -> Path:
        """R@1 against R-AUROC with the intervals (:func:`~bayesurl.sweeps.report.plot_results`)."""
        summary = self.summary()
        title = str(self.settings.get("preset", ""))
        over = plot_over(summary, observation_unit(self.runs))
        return plot_results(summary, path, title=title, over=over)

    def save(self, out: str | os.PathLike[str]) -> dict[str, Path]:
        """Write the sweep report into ``out`` (:func:`~bayesurl.sweeps.report.save_results`);
        the paths written (also kept in :attr:`paths`, the document in :attr:`document`)."""
        self.document, paths = save_results(self.runs, out, self.settings)
        self.paths = {k: str(v) for k, v in paths.items()}
        return paths


def merge_results(
    sources: Iterable[str | os.PathLike[str] | SweepResults],
) -> SweepResults:
    """Combine benchmark runs made separately (e.g. one seed per machine) into one result.

    Parameters
    ----------
    sources : iterable
        :class:`SweepResults`, ``results.json`` files, or folders holding one.

    Returns
    -------
    SweepResults
        All runs (estimator order of first appearance, then by seed); the settings of the first
        source with ``seeds`` / ``estimators`` updated and the sources' ``total_time`` summed.

    Raises
    ------
    FileNotFoundError
        If a path holds no ``results.json``.
    ValueError
        If a file is not a benchmark result, the presets or data differ, or an (estimator, seed)
        pair appears twice.
    """
    parts: list[SweepResults] = []
    for src in sources:
        if isinstance(src, SweepResults):
            parts.append(src)
            continue
        path = Path(src)
        if path.is_dir():
            path = path / "results.json"
        if not path.is_file():
            raise FileNotFoundError(f"benchmark result {str(path)!r} does not exist")
        data = read_results(path)
        try:
            parts.append(SweepResults(runs=list(data["runs"]), settings=dict(data["settings"])))
        except (KeyError, TypeError) as exc:
            what = f"no {exc} entry" if isinstance(exc, KeyError) else str(exc)
            raise ValueError(f"{str(path)!r} is not a bayesurl benchmark result: {what}") from None
        for i, r in enumerate(parts[-1].runs):
            if not isinstance(r, dict) or not isinstance(r.get("estimator"), str):
                raise ValueError(
                    f"{str(path)!r} is not a bayesurl benchmark result: runs[{i}] has no "
                    "'estimator' name"
                )
            if isinstance(r.get("seed"), bool) or not isinstance(r.get("seed"), int):
                raise ValueError(
                    f"{str(path)!r} is not a bayesurl benchmark result: runs[{i}] has no "
                    "integer 'seed'"
                )
    if not parts:
        raise ValueError("`sources` is empty")
    first = parts[0].settings
    for p in parts[1:]:
        for key in ("preset", "dataset", "sizes", "overrides"):
            if p.settings.get(key) != first.get(key):
                raise ValueError(f"cannot merge benchmark results with different `{key}`")
    runs = [r for p in parts for r in p.runs]
    seen: set[tuple[str, int]] = set()
    for r in runs:
        key = (r["estimator"], int(r["seed"]))
        if key in seen:
            raise ValueError(f"estimator {key[0]!r} seed {key[1]} appears in more than one source")
        seen.add(key)
    order = list(dict.fromkeys(r["estimator"] for r in runs))
    runs.sort(key=lambda r: (order.index(r["estimator"]), int(r["seed"])))
    settings = dict(first)
    settings["seeds"] = sorted({int(r["seed"]) for r in runs})
    settings["estimators"] = order
    settings["total_time"] = sum(float(p.settings.get("total_time") or 0.0) for p in parts)
    settings["merged_from"] = len(parts)
    return SweepResults(runs=runs, settings=settings)
