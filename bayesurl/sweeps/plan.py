"""The plan of a sweep: which estimators, class splits and seeds, and where the runs are kept.

A preset of a recipe file (``[presets.<name>]``) sets the run settings of every run (data
sizes, training length) and, in its ``sweep`` table, the plan:

``splits``
    ``0``: the data set's standard zero-shot split (FashionMNIST 0-4 -> 5-9, the folder sets'
    official classes); ``N``: ``N`` seeded class splits in complementary pairs
    (:func:`bayesurl.data.class_splits.class_splits`; URL, Kirchhof et al., 2023, section 3
    averages every model over several downstream sets).
``crossfit``
    Two or more disjoint lists of validation classes (e.g. ``[[3, 4], [6, 8]]``): the splits
    are then the cross-fitted ones of :func:`bayesurl.data.class_splits.crossfit_splits`
    (each split's validation set upstream, another downstream, with complements; ``splits``
    ``0`` or ``None``: all of them), so settings tuned on a split's own validation set were
    never chosen on its downstream classes. ``classes``: the data set's number of classes
    (default 10).
``val_classes``
    Fixed validation classes (e.g. six of clipart's classes): upstream in every split and
    never downstream, the other classes split in complementary pairs
    (:func:`bayesurl.data.class_splits.class_splits`), so settings tuned on them are clean for
    every split.
``seeds``
    Training seeds per split.
``storage``
    ``"memory"``: the runs live in the process (a quick look); ``"stored"``: an Optuna RDB
    storage (:class:`~bayesurl.sweeps.storage.SweepStorage`) that survives a kill and that
    workers on other machines can join.

:func:`plan_runs` lists the runs (split-major, so a worker finishes a split's data before the
next one); :func:`plan_sweep` adds what each run is run with, its resolved
:class:`~bayesurl.runs.config.RunConfig` included (:func:`resolve_run` states the order in
which the recipe, the preset, the tuned settings and the overrides apply). A stored sweep keeps
that config with the run, so a worker rebuilds it (:meth:`RunConfig.from_dict
<bayesurl.runs.config.RunConfig.from_dict>`) instead of reading the recipe again.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

from bayesurl._checks import check_int, check_ints
from bayesurl.data.class_splits import ClassSplit, class_splits, crossfit_splits
from bayesurl.runs.config import DEFAULT_RECIPE_FILE, RunConfig, load_recipe, read_recipe_file
from bayesurl.sweeps.storage import run_label

__all__ = [
    "SweepPreset",
    "SweepStore",
    "plan_runs",
    "plan_sweep",
    "preset_splits",
    "resolve_estimators",
    "resolve_run",
    "run_label",
    "smoke_notice",
    "sweep_preset",
]


class SweepStore(str, Enum):
    """Where the runs of a sweep are kept."""

    MEMORY = "memory"
    STORED = "stored"


@dataclass(frozen=True)
class SweepPreset:
    """The plan of one sweep scale.

    Parameters
    ----------
    name : str
        Preset name; also the sweep's name in a storage.
    recipe_preset : str or None
        The recipe file's preset whose run settings every run uses (``None``: the defaults).
    splits : int
        ``0``: the standard zero-shot split; ``N >= 1``: ``N`` class splits.
    seeds : tuple of int
        Training seeds per split.
    storage : SweepStore
        ``"memory"`` or ``"stored"`` (resumable, shareable by workers).
    smoke : bool
        A smoke-scale preset: says so when it runs (its ranking is noise, not a verdict).
    note : str
        How it was sized.
    verdict : str
        The preset whose results are the verdict a smoke-scale preset previews (named in its
        notice).
    crossfit : tuple of tuple of int, optional
        Validation sets of a cross-fitted plan (module docs); ``None``: seeded class splits.
    classes : int
        Number of classes of the data set (class splits).
    val_classes : tuple of int, optional
        Validation classes upstream in every split and never downstream (module docs).
    """

    name: str
    recipe_preset: str | None = None
    splits: int = 0
    seeds: tuple[int, ...] = (0,)
    storage: SweepStore = SweepStore.MEMORY
    smoke: bool = False
    note: str = ""
    verdict: str = "standard"
    crossfit: tuple[tuple[int, ...], ...] | None = None
    classes: int = 10
    val_classes: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "splits", check_int(self.splits, "splits", low=0))
        seeds = check_ints(self.seeds, "seeds", low=0)
        try:
            store = SweepStore(self.storage)
        except ValueError:
            valid = ", ".join(s.value for s in SweepStore)
            raise ValueError(f"unknown `storage` {self.storage!r}; valid: {valid}") from None
        if not isinstance(self.verdict, str) or not self.verdict:
            raise ValueError(f"`verdict` must name a preset, got {self.verdict!r}")
        object.__setattr__(self, "seeds", tuple(int(s) for s in seeds))
        object.__setattr__(self, "storage", store)
        if self.crossfit is not None:
            sets = tuple(tuple(int(c) for c in v) for v in self.crossfit)
            object.__setattr__(self, "crossfit", sets)
            preset_splits(self)  # the sets are checked where the plan is made
        if self.val_classes is not None:
            if self.crossfit is not None:
                raise ValueError("`val_classes` and `crossfit` exclude each other")
            object.__setattr__(self, "val_classes", tuple(int(c) for c in self.val_classes))
            if self.splits:
                preset_splits(self)

    @property
    def n_splits(self) -> int:
        """Number of class splits (0: the standard zero-shot split)."""
        return len(preset_splits(self)) if self.crossfit is not None else int(self.splits)

    @property
    def stored(self) -> bool:
        """Whether the runs live in a sweep storage."""
        return self.storage is SweepStore.STORED


_SWEEP_KEYS = (
    "splits",
    "seeds",
    "storage",
    "smoke",
    "note",
    "verdict",
    "crossfit",
    "classes",
    "val_classes",
)


def sweep_preset(
    dataset: str, name: str, *, recipe: Mapping[str, Any] | None = None
) -> SweepPreset:
    """The :class:`SweepPreset` of ``[presets.<name>]`` in ``dataset``'s recipe file
    (``recipe``: its tables as :func:`~bayesurl.runs.config.read_recipe_file` gave them;
    default: the file is read).

    Raises
    ------
    ValueError
        For an unknown preset (listing the valid ones) or an unknown / bad ``sweep`` key.
    """
    presets = (read_recipe_file(dataset) if recipe is None else recipe).get("presets", {})
    if name not in presets:
        raise ValueError(
            f"unknown `preset` {name!r} for {dataset}; valid presets: {', '.join(presets)}"
        )
    table = dict(presets[name].get("sweep", {}))
    unknown = [k for k in table if k not in _SWEEP_KEYS]
    if unknown:
        raise ValueError(
            f"unknown key `presets.{name}.sweep.{unknown[0]}`; valid: {', '.join(_SWEEP_KEYS)}"
        )
    if "seeds" in table:
        table["seeds"] = tuple(table["seeds"])
    if "crossfit" in table:
        table["crossfit"] = tuple(tuple(v) for v in table["crossfit"])
    if "val_classes" in table:
        table["val_classes"] = tuple(table["val_classes"])
    return SweepPreset(name=name, recipe_preset=name, **table)


def resolve_estimators(
    estimators: str | Iterable[str] | None,
    dataset: str,
    *,
    recipe: Mapping[str, Any] | None = None,
) -> list[str]:
    """Validate estimator names against the tables of ``dataset``'s recipe file.

    Parameters
    ----------
    estimators : str, iterable of str or None
        Names (a comma-separated string is split); ``None`` or ``"all"``: every table, in
        file order.
    dataset : str
        Recipe file name (or ``.toml`` path).
    recipe : mapping, optional
        Its tables as :func:`~bayesurl.runs.config.read_recipe_file` gave them (default: the
        file is read).

    Returns
    -------
    list of str
        Lower-case names in the given order, without duplicates.

    Raises
    ------
    ValueError
        For an unknown name (listing the valid ones) or an empty list.
    """
    valid = list((read_recipe_file(dataset) if recipe is None else recipe)["estimators"])
    if estimators is None:
        return valid
    if isinstance(estimators, str):
        estimators = estimators.split(",")
    names = [str(m).strip().lower() for m in estimators if str(m).strip()]
    if names == ["all"]:
        return valid
    if not names:
        raise ValueError(f"`estimators` is empty; valid names: {', '.join(valid)}")
    unknown = [n for n in names if n not in valid]
    if unknown:
        raise ValueError(
            f"unknown estimator(s) {', '.join(repr(u) for u in unknown)} in `estimators`; "
            f"valid names: {', '.join(valid)}"
        )
    return list(dict.fromkeys(names))


def preset_splits(preset: SweepPreset, *, split_seed: int = 0) -> list[ClassSplit]:
    """The class splits of ``preset`` (empty on the standard zero-shot split).

    Cross-fitted (``crossfit``) when the preset names validation sets, else ``splits``
    seeded splits in complementary pairs (with ``val_classes`` upstream in every one).
    """
    if preset.crossfit is not None:
        return crossfit_splits(
            preset.crossfit,
            num_classes=preset.classes,
            n_splits=int(preset.splits) or None,
            seed=split_seed,
        )
    if preset.splits == 0:
        return []
    return class_splits(
        preset.splits,
        num_classes=preset.classes,
        seed=split_seed,
        val_classes=preset.val_classes,
    )


def plan_runs(
    estimators: Sequence[str], preset: SweepPreset, *, split_seed: int = 0
) -> list[dict[str, Any]]:
    """The runs of the sweep: every split x estimator x seed, split-major.

    Each run is ``{"estimator", "split", "seed", "class_split", "stage"}``; ``class_split``
    is ``None`` on the standard zero-shot split (``preset.splits == 0``, ``split`` 0).

    Raises
    ------
    ValueError
        If ``estimators`` is empty.
    """
    if not estimators:
        raise ValueError("`estimators` is empty")
    found = preset_splits(preset, split_seed=split_seed)
    splits = [(sp.index, sp.to_dict()) for sp in found] if found else [(0, None)]
    return [
        {"estimator": str(e), "split": k, "seed": int(s), "class_split": cs, "stage": "final"}
        for k, cs in splits
        for e in estimators
        for s in preset.seeds
    ]


Override = str | tuple[str, Any]


def plain_overrides(overrides: Iterable[Override | Sequence[Any]]) -> list[Any]:
    """``"key=value"`` strings and ``[key, value]`` pairs (JSON-able, as a storage keeps them)."""
    return [o if isinstance(o, str) else [o[0], o[1]] for o in overrides]


def resolve_run(
    dataset: str,
    preset: SweepPreset,
    params: Mapping[str, Any],
    *,
    overrides: Iterable[Override] = (),
    tuned: Mapping[str, Sequence[str]] | None = None,
    recipe_tuned: bool = True,
    device: str | None = None,
    recipe: Mapping[str, Any] | None = None,
) -> RunConfig:
    """The :class:`~bayesurl.runs.config.RunConfig` of the run ``params``.

    The one statement of the order in which a run's settings apply (a later one wins):

    1. the recipe file's tables (``[data]``, ``[backbone]``, ``[train]``, ``[eval]``, ``seed``);
    2. the preset's run settings (``[presets.<preset.recipe_preset>.<section>]``);
    3. the estimator's own table (``[estimators.<name>]``);
    4. the preset's committed tuned settings (``[presets.<name>.tuned]``, the set the run's
       class split picks), when the run's ``recipe_tuned`` (else ``recipe_tuned``) is true;
    5. the sweep's ``--set`` overrides: the planning machine's (``params["sweep_overrides"]``),
       then this machine's own (``overrides``, e.g. a worker's local cache path);
    6. the settings of this sweep's own search: ``params["overrides"]``, else
       ``tuned[estimator]``;
    7. the run itself: its class split and stage (``data.class_split``, ``data.stage``), its
       ``seed`` and the ``device``.

    ``estimator.*`` keys of 5 and 6 change only the named estimator, the others also its
    post-hoc base (:func:`~bayesurl.runs.config.load_recipe`).

    Parameters
    ----------
    dataset : str
        Recipe file.
    preset : SweepPreset
        The plan; its ``recipe_preset`` names the run settings.
    params : mapping
        The run (:func:`plan_sweep`): ``estimator``, ``seed``, and optionally ``class_split``,
        ``stage``, ``sweep_overrides``, ``overrides``, ``recipe_tuned``.
    overrides, tuned, recipe_tuned, device
        This machine's own overrides, the sweep's tuned settings per estimator, the default
        of ``recipe_tuned``, the device (``None``: left to the recipe).
    recipe : mapping, optional
        The file's tables as :func:`~bayesurl.runs.config.read_recipe_file` gave them (a
        sweep reads its file once); default: the file is read.

    Raises
    ------
    ValueError
        As :func:`~bayesurl.runs.config.load_recipe` (unknown keys, values of the wrong type,
        no tuned set for the run's class split).
    """
    est = str(params["estimator"])
    own = list(params.get("overrides") or (tuned or {}).get(est, []))
    lead = [o if isinstance(o, str) else (o[0], o[1]) for o in params.get("sweep_overrides", [])]
    cs = params.get("class_split")
    run = [("data.class_split", dict(cs))] if cs else []
    run.append(("data.stage", str(params.get("stage", "final"))))
    if params.get("seed") is not None:
        run.append(("seed", int(params["seed"])))
    if device is not None:
        run.append(("device", str(device)))
    return load_recipe(
        f"{dataset}/{est}",
        [*lead, *overrides, *own, *run],
        preset=preset.recipe_preset,
        tuned=bool(params.get("recipe_tuned", recipe_tuned)),
        recipe=recipe,
    )


def plan_sweep(
    dataset: str,
    estimators: Sequence[str],
    preset: SweepPreset,
    *,
    overrides: Iterable[Override] = (),
    tuned: Mapping[str, Sequence[str]] | None = None,
    tuned_classes: Mapping[str, tuple[Any, Any]] | None = None,
    recipe_tuned: bool = True,
    device: str | None = None,
    resolve: bool = True,
    recipe: Mapping[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """The runs of :func:`plan_runs`, each with what it is run with.

    Each run also holds ``overrides`` (the settings this sweep's search chose for its
    estimator, with their ``tuned_on`` / ``tuned_trained_on`` classes), ``sweep_overrides``
    (this machine's ``overrides``: every worker runs with them), ``recipe_tuned`` and, with
    ``resolve``, ``config``: the run's resolved config (:func:`resolve_run`) as
    :meth:`RunConfig.to_dict <bayesurl.runs.config.RunConfig.to_dict>` gives it, so every
    recipe, preset and override is checked for every run before anything trains (``recipe``:
    the file's tables, read once by the caller; default: read here).

    Raises
    ------
    ValueError
        If ``estimators`` is empty, or as :func:`resolve_run`.
    """
    runs = plan_runs(estimators, preset)
    shared = plain_overrides(overrides)
    if resolve and recipe is None:
        recipe = read_recipe_file(dataset)
    for r in runs:
        r["overrides"] = list((tuned or {}).get(r["estimator"], []))
        if r["overrides"]:  # settings of this sweep's own search: its classes
            on, trained = (tuned_classes or {}).get(r["estimator"], (None, None))
            r["tuned_on"], r["tuned_trained_on"] = on, trained
        r["sweep_overrides"] = shared
        r["recipe_tuned"] = bool(recipe_tuned)
        if resolve:
            r["config"] = resolve_run(dataset, preset, r, device=device, recipe=recipe).to_dict()
    return runs


def smoke_notice(preset: SweepPreset, dataset: str = DEFAULT_RECIPE_FILE) -> str | None:
    """The line a smoke-scale preset prints (``None`` for a real one); the command it names
    carries ``--dataset`` where the recipe file is not the command's default."""
    if not preset.smoke:
        return None
    scale = preset.note or "few epochs, small sets"
    data = "" if dataset == DEFAULT_RECIPE_FILE else f"--dataset {dataset} "
    return (
        f"NOTE: --preset {preset.name} is a smoke-scale run ({scale}): its ranking of the "
        f"uncertainties is noise, not a verdict. The real benchmark: `bayesurl benchmark {data}"
        f"--preset {preset.verdict}` (class splits, stored and resumable; add machines with "
        "--worker --storage URL)."
    )
