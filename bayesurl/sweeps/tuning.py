"""Hyper-parameter search of a sweep: URL's selection protocol with Optuna.

Per estimator, ``N`` TPE trials on the class-disjoint validation classes of the first class
split (``data.stage = "tune"``); the objective is the R-AUROC and trials with R@1 < 0.1 are
discarded (URL, Kirchhof et al., 2023, section 3, "Hyperparameters"). The chosen settings go
to ``<out>/tuned.json``, which every later run of the sweep in ``<out>`` reuses, and to
``<out>/tuned.toml``, the ``[presets.<name>.tuned]`` table that commits them to the recipe
(:func:`bayesurl.runs.config.preset_tuned`).

What is searched follows the tuning rule its kind declares
(:class:`~bayesurl.runs.estimators.Tuning`) and its recipe table (:func:`search_space`): a
trained method its learning rate and its own keys (the ``tune`` key of its table, e.g.
``infonce = { ..., tune = { "estimator.kwargs.inverse_temperature" = ["float", 8.0, 64.0] } }``
in the base table of estimators); a post-hoc wrapper the rate
of its own fit, on top of its base's chosen settings (bases are tuned first, so the wrapper
sits on the same net as the base's row); a free baseline or a wrapper without a fit of its
own (laplace-torch's prior precision comes from the marginal likelihood) nothing.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from bayesurl._checks import check_int, check_number
from bayesurl.data.class_splits import ClassSplit
from bayesurl.files import atomic_write, write_json
from bayesurl.runs.config import inherit_estimators
from bayesurl.runs.estimators import ESTIMATORS, Tuning
from bayesurl.sweeps.storage import RunFn, RunStore

__all__ = [
    "load_tuned",
    "load_tuned_classes",
    "search_space",
    "tune_estimators",
    "tuned_table",
    "tuning_leaks",
]

#: A search space (URL appendix B): ``{override key: ("log" | "float" | "int", low, high)}``.
Space = dict[str, tuple[str, float, float]]

_SPACE_KINDS = ("log", "float", "int")
_SECTIONS = ("data", "backbone", "train", "eval", "estimator")

#: Every trained estimator tunes the learning rate in URL's range [1e-4, 1e-2].
_TRAINED_SPACE: Space = {"train.lr": ("log", 1e-4, 1e-2)}

#: The rate of a post-hoc wrapper's own fit (``[estimators.<name>.fit]``), URL's range.
_WRAPPER_SPACE: Space = {"estimator.fit.lr": ("log", 1e-4, 1e-2)}


def _checked_range(spec: object, where: str) -> tuple[str, float, float]:
    """``[kind, low, high]`` of one searched key (a log range needs ``low > 0``)."""
    if not isinstance(spec, list) or len(spec) != 3:
        raise ValueError(f"`{where}` must be [kind, low, high], got {spec!r}")
    kind, lo, hi = spec
    if kind not in _SPACE_KINDS:
        raise ValueError(f"`{where}`: unknown kind {kind!r}; valid: {', '.join(_SPACE_KINDS)}")
    if kind == "int":
        lo, hi = check_int(lo, f"{where}[1]"), check_int(hi, f"{where}[2]")
    else:
        lo, hi = check_number(lo, f"{where}[1]"), check_number(hi, f"{where}[2]")
    if not lo < hi or (kind == "log" and lo <= 0):
        raise ValueError(f"`{where}` needs {'0 < ' if kind == 'log' else ''}low < high, got {spec}")
    return kind, lo, hi


def _own_space(name: str, table: Mapping[str, Any]) -> Space:
    """The ``tune`` key of an estimator's table: its own keys of the search, checked."""
    spec = table.get("tune") or {}
    where = f"estimators.{name}.tune"
    if not isinstance(spec, Mapping):
        raise ValueError(f'`{where}` must be a table {{ "<override key>" = [kind, low, high] }}')
    for key in spec:
        if key.split(".", 1)[0] not in _SECTIONS or "." not in key:
            raise ValueError(
                f"`{where}`: {key!r} is not an override key ({', '.join(_SECTIONS)}.<key>)"
            )
    return {k: _checked_range(v, f"{where}.{k}") for k, v in spec.items()}


def search_space(
    estimator: str, table: Mapping[str, Any] | None = None
) -> dict[str, tuple[str, float, float]]:
    """The search space of ``estimator`` given its recipe table (see the module docs).

    Parameters
    ----------
    estimator : str
        Estimator name.
    table : mapping, optional
        Its recipe table (``kind``, ``fit``, ``tune``: its own keys); ``None``: its line in the
        shipped base table of estimators (a trained method with only the protocol's keys
        where it has none).

    Returns
    -------
    dict
        ``{override key: (kind, low, high)}``; empty when there is nothing to tune.

    Raises
    ------
    ValueError
        For a malformed ``tune`` (a key outside the run config's sections, an unknown kind, a
        range that is not ``low < high``), naming ``estimators.<name>.tune.<key>``.
    """
    if table is None:
        table = inherit_estimators("estimators", {}).get(estimator, {})
    kind = str(table.get("kind", "method"))
    rule = Tuning(ESTIMATORS.entry(kind, argument=f"estimators.{estimator}.kind").traits["tuning"])
    own = _own_space(estimator, table)
    if own and rule is not Tuning.TRAINED:
        raise ValueError(
            f"`estimators.{estimator}.tune`: an estimator of kind {kind.lower()!r} searches "
            + ("nothing" if rule is Tuning.NONE else "only `estimator.fit.lr`")
        )
    if rule is Tuning.NONE:
        return {}
    if rule is Tuning.FIT_RATE:
        return dict(_WRAPPER_SPACE) if "lr" in (table.get("fit") or {}) else {}
    return {**_TRAINED_SPACE, **own}


def _base_first(estimators: Sequence[str], tables: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """``estimators`` with every base that is also listed moved before its first user."""
    order: list[str] = []
    for est in estimators:
        base = (tables.get(est) or {}).get("base")
        if base in estimators and base not in order:
            order.append(str(base))
        if est not in order:
            order.append(est)
    return order


def _suggest(trial: Any, space: Mapping[str, tuple[str, float, float]]) -> list[str]:
    out = []
    for key, (kind, lo, hi) in space.items():
        if kind == "log":
            v: float | int = trial.suggest_float(key, lo, hi, log=True)
        elif kind == "int":
            v = trial.suggest_int(key, int(lo), int(hi))
        else:
            v = trial.suggest_float(key, lo, hi)
        out.append(f"{key}={v!r}")
    return out


def tune_estimators(
    estimators: Sequence[str],
    n_trials: int,
    run_fn: RunFn,
    store: RunStore,
    *,
    split: ClassSplit,
    out: str | os.PathLike[str] | None = None,
    tables: Mapping[str, Mapping[str, Any]] | None = None,
    preset: str | None = None,
    min_r1: float = 0.1,
    seed: int = 0,
    log: Callable[[str], None] = print,
) -> dict[str, dict[str, Any]]:
    """URL's selection protocol with Optuna: per estimator ``n_trials`` TPE trials.

    Each trial trains on the upstream classes of ``split`` minus its validation classes and
    retrieves among the validation classes (``stage="tune"``); the objective is the R-AUROC,
    and trials with R@1 < ``min_r1`` are discarded (pruned; URL section 3). The studies
    (``"tune:<sweep>:<estimator>"``) live in ``store``, a stored or in-memory one, so a
    restarted or multi-worker search goes on where it stopped, up to ``n_trials``.

    Parameters
    ----------
    estimators : sequence of str
        Estimators to tune; a listed base is tuned before the rows built on it.
    n_trials : int
        Finished (complete or discarded) trials per estimator with something to tune.
    run_fn : callable
        ``run_fn(params) -> record`` of one run (:class:`~bayesurl.sweeps.pipeline.PipelineRun`).
    store : RunStore
        Where the Optuna studies live (:mod:`bayesurl.sweeps.storage`).
    split : ClassSplit
        The class split whose validation classes are tuned on.
    out : path-like, optional
        Folder of ``tuned.json`` and ``tuned.toml``.
    tables : mapping, optional
        The recipe's estimator tables (``kind``, ``base``, ``fit``; :func:`search_space`).
    preset : str, optional
        Preset named in the header of ``tuned.toml``.
    min_r1 : float
        Trials below this R@1 are discarded.
    seed : int
        Training seed of every trial and seed of the TPE sampler.
    log : callable
        One line per finished trial.

    Returns
    -------
    dict
        ``{estimator: {"overrides", "own", "params", "r_auroc", "r@1", "trials",
        "discarded", "tuned_on", "trained_on"}}``: ``own`` the estimator's chosen settings
        (empty when every trial was discarded or there is nothing to tune: the recipe's
        defaults stay), ``overrides`` its base's chosen run settings followed by ``own`` (what
        a run of the row needs), ``tuned_on`` the validation classes that scored the trials and
        ``trained_on`` the classes they trained on (every run with these settings records
        both); also written to ``<out>/tuned.json`` and ``<out>/tuned.toml`` with ``out``.
    """
    check_int(n_trials, "n_trials", low=1)
    tables = tables or {}
    chosen: dict[str, dict[str, Any]] = {}
    for est in _base_first(estimators, tables):
        space = search_space(est, tables.get(est))
        # the base's run settings (its rate, not its own estimator keys) come first
        base_own = chosen.get(str((tables.get(est) or {}).get("base")), {}).get("own", [])
        under = [o for o in base_own if not o.startswith("estimator.")]
        if not space:
            chosen[est] = {**_choice(under, None, 0), "skipped": "nothing to tune"}
            log(f"tune {est}: nothing to tune")
            continue
        complete, pruned = _search(est, space, under, int(n_trials), run_fn, store,
                                   split=split, min_r1=min_r1, seed=seed, log=log)  # fmt: skip
        best = max(complete, key=lambda t: t.value, default=None)
        chosen[est] = _choice(under, best, len(complete), len(pruned))
    trained = sorted(c for c in split.upstream if c not in split.val)
    for c in chosen.values():
        c.update(tuned_on=sorted(split.val), trained_on=trained)
    if out is not None:
        _save_tuned(Path(out), chosen, split, preset)
    return chosen


def _search(
    est: str,
    space: Mapping[str, tuple[str, float, float]],
    under: list[str],
    n_trials: int,
    run_fn: RunFn,
    store: RunStore,
    *,
    split: ClassSplit,
    min_r1: float,
    seed: int,
    log: Callable[[str], None],
) -> tuple[list[Any], list[Any]]:
    """Run (or go on with) the study of ``est`` until it holds ``n_trials`` finished trials
    (see :func:`tune_estimators`); its complete and its discarded trials."""
    import optuna

    st = optuna.trial.TrialState
    study = store.tuning_study(est, sampler=optuna.samplers.TPESampler(seed=seed))

    def objective(trial: Any) -> float:
        overrides = _suggest(trial, space)
        rec = run_fn(
            {
                "estimator": est,
                "split": split.index,
                "seed": seed,
                "class_split": split.to_dict(),
                "stage": "tune",
                "overrides": [*under, *overrides],
            }
        )
        for k in ("r@1", "r_auroc"):
            v = rec.get(k)
            trial.set_user_attr(k, None if v is None else float(v))
        if rec.get("error"):
            trial.set_user_attr("error", str(rec["error"]))
            raise optuna.TrialPruned(f"run failed: {rec['error']}")
        r1, ra = rec.get("r@1"), rec.get("r_auroc")
        if r1 is None or ra is None or not math.isfinite(float(ra)) or float(r1) < min_r1:
            trial.set_user_attr("discarded", f"R@1 {r1} < {min_r1}")
            raise optuna.TrialPruned(f"R@1 {r1} < {min_r1}")
        log(f"tune {est} trial {trial.number}: R-AUROC {ra:.4f}, R@1 {r1:.4f} {overrides}")
        return float(ra)

    done = len(study.get_trials(deepcopy=False, states=(st.COMPLETE, st.PRUNED)))
    if done:  # a resumed search: a sampler seeded as at the start would repeat its trials
        study.sampler = optuna.samplers.TPESampler(seed=seed + done)
    if done < n_trials:
        study.optimize(
            objective,
            n_trials=n_trials - done,
            callbacks=[optuna.study.MaxTrialsCallback(n_trials, states=(st.COMPLETE, st.PRUNED))],
            catch=(),
        )
    return (
        study.get_trials(deepcopy=False, states=(st.COMPLETE,)),
        study.get_trials(deepcopy=False, states=(st.PRUNED,)),
    )


def _save_tuned(
    out: Path, chosen: Mapping[str, dict[str, Any]], split: ClassSplit, preset: str | None
) -> None:
    """Add ``chosen`` to ``out/tuned.json`` and rewrite ``out/tuned.toml`` from it.

    Raises
    ------
    ValueError
        If the file holds settings tuned on other validation classes.
    """
    path = out / "tuned.json"
    old = json.loads(path.read_text()) if path.is_file() else {}
    stale = [e for e, c in old.items() if c.get("tuned_on") not in (None, sorted(split.val))]
    if stale:
        raise ValueError(
            f"{path} holds settings tuned on other classes ({', '.join(stale)}); tune "
            "each validation set into its own folder"
        )
    old.update(chosen)
    write_json(path, old)
    atomic_write(out / "tuned.toml", tuned_table(old, preset))


def _choice(under: list[str], best: Any, complete: int, pruned: int = 0) -> dict[str, Any]:
    """The record of one estimator's search: ``best`` an Optuna trial or ``None``."""
    own = [] if best is None else [f"{k}={v!r}" for k, v in best.params.items()]
    return {
        "overrides": [*under, *own],
        "own": own,
        "params": {} if best is None else dict(best.params),
        "r_auroc": None if best is None else best.value,
        "r@1": None if best is None else best.user_attrs.get("r@1"),
        "trials": complete + pruned,
        "discarded": pruned,
    }


def tuned_table(chosen: Mapping[str, Mapping[str, Any]], preset: str | None) -> str:
    """The TOML table of ``chosen`` (:func:`tune_estimators`) for the recipe.

    ``[presets.<preset>.tuned.val_<classes>]`` (one sub-table per validation set, so the
    sets of a cross-fitted plan sit side by side; ``[presets.<preset>.tuned]`` when the
    classes are not recorded) with ``tuned_on`` and ``trained_on``; every estimator with
    settings of its own gets one line of ``"key=value"`` strings and a comment with its
    validation R-AUROC and trial count; a post-hoc row lists only its own settings, its base
    takes the base's line.
    """
    ons = {json.dumps(c.get("tuned_on")) for c in chosen.values()}
    on = chosen[next(iter(chosen))].get("tuned_on") if len(ons) == 1 and chosen else None
    trained = chosen[next(iter(chosen))].get("trained_on") if on is not None else None
    head = f"[presets.{preset or '<name>'}.tuned"
    head += f".val_{'_'.join(str(c) for c in on)}]" if on else "]"
    lines = [
        "# chosen by `bayesurl benchmark --tune`: URL's selection on the validation classes",
        head,
    ]
    if on:
        lines += [f"tuned_on = {json.dumps(list(on))}", f"trained_on = {json.dumps(trained)}"]
    for est, c in chosen.items():
        own = list(c.get("own", c.get("overrides", [])))
        if not own:
            continue
        items = ", ".join(json.dumps(o) for o in own)
        ra = c.get("r_auroc")
        note = f"validation R-AUROC {ra:.4f}, " if isinstance(ra, float) else ""
        lines.append(f"{est} = [{items}]  # {note}{c.get('trials')} trials")
    return "\n".join(lines) + "\n"


def load_tuned_classes(
    out: str | os.PathLike[str],
) -> dict[str, tuple[list[int] | None, list[int] | None]]:
    """``{estimator: (tuned_on, trained_on)}`` of ``<out>/tuned.json`` (``None``: not
    recorded; ``{}`` if the file is absent)."""
    path = Path(out) / "tuned.json"
    if not path.is_file():
        return {}
    data = json.loads(path.read_text())
    return {str(k): (v.get("tuned_on"), v.get("trained_on")) for k, v in data.items()}


def load_tuned(out: str | os.PathLike[str]) -> dict[str, list[str]]:
    """The chosen overrides per estimator from ``<out>/tuned.json`` (``{}`` if absent).

    Raises
    ------
    ValueError
        If the file is not valid JSON of the expected form.
    """
    path = Path(out) / "tuned.json"
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
        return {str(k): [str(o) for o in v["overrides"]] for k, v in data.items()}
    except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"{path} is not a tuned-settings file: {exc}") from None


def tuning_leaks(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Which run records were tuned on one of their own downstream classes.

    Parameters
    ----------
    records : sequence of mapping
        Run records with ``downstream`` (the run's downstream classes; ``None`` on a data
        set's standard split) and ``tuned_on`` (the classes whose validation scores chose the
        run's settings; ``[]``: the recipe's defaults).

    Returns
    -------
    dict
        ``{"ok", "leaky": [{"estimator", "split", "seed", "classes"}], "unrecorded": n,
        "line"}``: ``ok`` when no finished run's ``tuned_on`` meets its downstream classes and
        every finished run records ``tuned_on``; ``line`` says why not in one sentence.
    """
    leaky, unrecorded = [], 0
    for r in records:
        if r.get("error") is not None:
            continue
        tuned = r.get("tuned_on")
        if tuned is None:
            unrecorded += 1
            continue
        meet = sorted(set(int(c) for c in tuned) & set(int(c) for c in (r.get("downstream") or [])))
        if meet:
            leaky.append(
                {
                    "estimator": r.get("estimator"),
                    "split": r.get("split"),
                    "seed": r.get("seed"),
                    "classes": meet,
                }
            )
    if leaky:
        splits = sorted({x["split"] for x in leaky})
        line = (
            f"NO VERDICT: {len(leaky)} runs (splits {', '.join(map(str, splits[:8]))}"
            f"{' ...' if len(splits) > 8 else ''}) use settings tuned on classes that are "
            "downstream in their own split (selection on the test classes); run a cross-fitted "
            "plan (sweep.crossfit) or the recipe's defaults (--untuned)"
        )
    elif unrecorded:
        line = (
            f"NO VERDICT: {unrecorded} runs do not record `tuned_on` (the classes their "
            "settings were tuned on), so a selection on their test classes cannot be ruled out"
        )
    else:
        line = "tuning check: no run's settings were tuned on one of its downstream classes"
    return {
        "ok": not leaky and not unrecorded,
        "leaky": leaky,
        "unrecorded": unrecorded,
        "line": line,
    }
