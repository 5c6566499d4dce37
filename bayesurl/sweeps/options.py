"""How a sweep runs: :class:`SweepOptions`, each field declared once with its flag and help.

``bayesurl benchmark``'s options are generated from the fields (:func:`add_flags`,
:meth:`SweepOptions.from_flags`, :data:`FLAGS`), so a field, its flag, its help and the flag an
error names cannot drift apart. The module imports no part of the run pipeline: the command
line's parser is built from it whatever the command (``bayesurl evaluate`` starts without the
pipeline). What needs the recipe file (the file and the preset exist) is checked where
:func:`~bayesurl.sweeps.sweep.run_sweep` reads it, once, before anything runs.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

import torch

from bayesurl._checks import check_device, check_int, check_ints, check_number, check_output_dir

if TYPE_CHECKING:
    from bayesurl.sweeps.plan import SweepPreset

__all__ = ["FLAGS", "SweepOptions", "add_flags", "parse_seeds"]

#: the recipe file of a sweep that names none (``bayesurl.runs.config.DEFAULT_RECIPE_FILE``)
DEFAULT_DATASET = "fashion_mnist"

#: the argument group of the options that concern stored sweeps
STORED = "stored sweeps (resumable, several workers)"


def parse_seeds(text: str) -> list[int]:
    """``"0,1,2"`` -> ``[0, 1, 2]``; a single number ``"3"`` is a count -> ``[0, 1, 2]``.

    A single explicit seed is written with a trailing comma (``"7,"``).

    Raises
    ------
    ValueError
        On anything but non-negative integers, or a count below 1.
    """
    raw = str(text).strip()
    try:
        if "," in raw:
            parts = [s.strip() for s in raw.removesuffix(",").split(",")]
            if "" in parts:  # "0,,1": a seed left out, not a list of two
                raise ValueError(f"`--seeds {raw}` has an empty entry")
            seeds = [int(s) for s in parts]
            if len(set(seeds)) != len(seeds):
                raise ValueError(f"`--seeds {raw}` names a seed twice")
        else:
            n = int(raw)
            if n < 0:
                raise ValueError(f"`--seeds {raw}`: seeds are non-negative integers")
            if n < 1:
                raise ValueError(
                    f"`--seeds {raw}`: a single number is a count (>= 1); "
                    f"write `{raw},` for that one seed"
                )
            seeds = list(range(n))
    except ValueError as exc:
        if "`--seeds" in str(exc):
            raise
        raise ValueError(
            f"`--seeds` must be a count (3) or a comma-separated list (0,1,2), got {text!r}"
        ) from None
    if not seeds or min(seeds) < 0:
        raise ValueError(f"`--seeds` must hold non-negative integers, got {text!r}")
    return list(dict.fromkeys(seeds))


def _flag(
    flag: str,
    help: str,
    *,
    group: str | None = None,
    parse: Callable[[Any], Any] | None = None,
    **argparse_kwargs: Any,
) -> dict[str, Any]:
    """A field's command-line declaration: its flag, help (``{name}`` placeholders are filled
    by :func:`add_flags`), argument group, the parse of the flag's text (errors keep their
    message, unlike an argparse ``type``) and argparse's other keywords."""
    return {"flag": flag, "help": help, "group": group, "parse": parse, "argparse": argparse_kwargs}


@dataclass(frozen=True)
class SweepOptions:
    """How :func:`~bayesurl.sweeps.sweep.run_sweep` runs a sweep (checked once, here).

    Parameters
    ----------
    dataset : str
        Recipe file (``"fashion_mnist"`` ...).
    preset : str, SweepPreset or None
        ``[presets.<name>]`` of the file (``"smoke"``, ``"quick"``, ``"standard"``,
        ``"full"``), or a plan; ``None``: the file's defaults, one split, in memory.
    seeds : int or sequence of int, optional
        Training seeds instead of the preset's (an int ``n`` means ``range(n)``).
    splits : int, optional
        Class splits instead of the preset's (``0``: the standard zero-shot split).
    overrides : sequence
        ``"section.key=value"`` overrides applied to every run
        (:func:`~bayesurl.sweeps.plan.resolve_run` states where they come in).
    device : str or torch.device, optional
        Default: CUDA if available, else CPU (under torchrun ``cuda:LOCAL_RANK``).
    out : path-like, optional
        Results folder (with each run's per-query record ``queries/<run>.npz``,
        :mod:`bayesurl.runs.queries`); ``None``: a stored sweep writes to
        ``results/sweeps/<preset>``, an in-memory one to ``default_out``.
    default_out : path-like, optional
        Where an in-memory sweep writes when ``out`` is ``None`` (``None``: nowhere).
    storage : str, optional
        SQLAlchemy URL of a sweep storage (default of a stored preset:
        ``sqlite:///<out>/sweep.db``); giving one stores any preset's runs.
    worker : bool
        Only work on the runs already in the storage (no tuning, no planning). Each run
        carries the planning machine's resolved config; the worker's own overrides apply on
        top (the run is then resolved again).
    tune : int
        Optuna trials per estimator before the sweep (0: reuse ``<out>/tuned.json``).
    tune_only : bool
        Stop after tuning: nothing is planned, the chosen settings are in
        ``SweepResults.settings["tuned"]`` (and ``<out>/tuned.json`` / ``tuned.toml``).
    tune_split : int
        The class split whose validation classes the search is scored on (its ``val``; it
        trains on the split's other upstream classes). In a cross-fitted plan split ``g``
        holds the ``g``-th validation set (``0`` and ``1`` for two sets).
    recipe_tuned : bool
        Apply the tuned settings the recipe commits for the preset
        (``[presets.<name>.tuned]``); ``False`` runs the recipe's defaults (stored with each
        planned run, so the workers follow the lead).
    checkpoint_dir : path-like, optional
        Keep each run's checkpoint in ``checkpoint_dir/<estimator>[_split<k>]_s<seed>/``.
    save_checkpoints : bool
        Keep them in ``<out>/checkpoints`` (when ``checkpoint_dir`` is not given).
    progress : bool
        One line per finished run.
    raise_errors : bool
        Re-raise a failing run's exception instead of recording it and going on.
    poll, heartbeat_interval, plan_timeout
        Of a stored sweep: seconds between looks while waiting for other workers, between a
        running run's heartbeats, and how long a ``worker`` waits for the plan.

    Raises
    ------
    ValueError
        For ``tune`` < 0, ``tune`` with ``worker``, ``tune_only`` without ``tune``,
        ``tune_split`` < 0, ``poll`` <= 0 or ``heartbeat_interval`` < 1 (naming the
        argument). An unknown recipe file or preset is named by
        :func:`~bayesurl.sweeps.sweep.run_sweep`, which reads the file.

    Notes
    -----
    A field's ``metadata`` holds its ``bayesurl benchmark`` flag (:func:`add_flags`).
    """

    dataset: str = field(
        default=DEFAULT_DATASET,
        metadata=_flag("--dataset", f"recipe file (default: {DEFAULT_DATASET})"),
    )
    preset: str | SweepPreset | None = field(
        default="quick",
        metadata=_flag(
            "--preset",
            "a preset of the recipe file: smoke (tests), quick (minutes, one split), "
            "standard (4 class splits, stored, resumable), full; on pretrained features "
            "pretrained_smoke, pretrained_quick (the main job, make run) and pretrained (the "
            "cross-fitted class splits). The default recipe's presets: {presets}",
        ),
    )
    seeds: int | Sequence[int] | None = field(
        default=None,
        metadata=_flag(
            "--seeds",
            "comma-separated seeds (0,1,2; one seed: 7,) or a count (3 = seeds 0,1,2); "
            "default: the preset's (seed 0)",
            parse=parse_seeds,
        ),
    )
    splits: int | None = field(
        default=None,
        metadata=_flag(
            "--splits",
            "class splits instead of the preset's (0: the standard zero-shot split)",
            type=int,
        ),
    )
    overrides: Sequence[str | tuple[str, Any]] = field(
        default=(),
        metadata=_flag(
            "--set",
            "override a config value of every run (train.epochs=5), repeatable",
            action="append",
            metavar="KEY=VALUE",
        ),
    )
    device: str | torch.device | None = field(
        default=None, metadata=_flag("--device", "cpu, cuda, cuda:1 ... (default: auto)")
    )
    out: str | os.PathLike[str] | None = field(
        default=None,
        metadata=_flag(
            "--out",
            "output folder (default: {default_out}; a stored sweep: results/sweeps/PRESET)",
        ),
    )
    default_out: str | os.PathLike[str] | None = None
    storage: str | None = field(
        default=None,
        metadata=_flag(
            "--storage",
            "SQLAlchemy URL of the sweep storage (default of a stored preset: "
            "sqlite:///OUT/sweep.db); postgresql+psycopg2://... for workers on several machines",
            group=STORED,
            metavar="URL",
        ),
    )
    worker: bool = field(
        default=False,
        metadata=_flag(
            "--worker",
            "join a running sweep: work on the runs already in --storage, then exit",
            group=STORED,
            action="store_true",
        ),
    )
    tune: int = field(
        default=0,
        metadata=_flag(
            "--tune",
            "Optuna trials per estimator on the validation classes before the sweep "
            "(R-AUROC objective, R@1 < 0.1 discarded); chosen settings -> OUT/tuned.json and "
            "OUT/tuned.toml (the recipe's [presets.NAME.tuned] table)",
            group=STORED,
            type=int,
            metavar="N",
        ),
    )
    tune_only: bool = field(
        default=False,
        metadata=_flag(
            "--tune-only",
            "stop after --tune: plan and run nothing (then commit OUT/tuned.toml)",
            group=STORED,
            action="store_true",
        ),
    )
    tune_split: int = field(
        default=0,
        metadata=_flag(
            "--tune-split",
            "tune on class split K's validation classes (training on its other upstream "
            "classes); in a cross-fitted preset split K holds the K-th validation set",
            group=STORED,
            type=int,
            metavar="K",
        ),
    )
    recipe_tuned: bool = field(
        default=True,
        metadata=_flag(
            "--untuned",
            "ignore the preset's committed [presets.NAME.tuned] table: the recipe's default "
            "settings (how results/pretrained/protocol ran); a --worker follows the lead's "
            "choice",
            group=STORED,
            action="store_false",
        ),
    )
    checkpoint_dir: str | os.PathLike[str] | None = None
    save_checkpoints: bool = field(
        default=False,
        metadata=_flag(
            "--save-checkpoints",
            "keep each run's checkpoint in OUT/checkpoints/<estimator>[_split<k>]_s<seed>/",
            action="store_true",
        ),
    )
    progress: bool = field(
        default=True,
        metadata=_flag("--no-progress", "hide the per-run lines", action="store_false"),
    )
    raise_errors: bool = False
    poll: float = field(
        default=10.0,
        metadata=_flag(
            "--poll",
            "seconds between looks while waiting for the plan or for runs elsewhere (default: 10)",
            group=STORED,
            type=float,
            metavar="SECONDS",
        ),
    )
    heartbeat_interval: int = field(
        default=30,
        metadata=_flag(
            "--heartbeat",
            "seconds between a running run's heartbeats; a run whose worker stays silent for "
            "4 heartbeats (killed, machine lost) is given to another worker (default: 30)",
            group=STORED,
            type=int,
            metavar="SECONDS",
        ),
    )
    plan_timeout: float = 3600.0

    def __post_init__(self) -> None:
        if isinstance(self.overrides, str):
            raise TypeError(
                f"`overrides` must be a sequence of 'section.key=value' strings, got the string "
                f"{self.overrides!r} (wrap it in a list)"
            )
        object.__setattr__(self, "overrides", tuple(self.overrides))
        for o in self.overrides:
            if isinstance(o, str) and "=" not in o:
                raise ValueError(f"`overrides`: {o!r} is not of the form section.key=value")
        for name in ("worker", "tune_only", "recipe_tuned", "save_checkpoints", "progress",
                     "raise_errors"):  # fmt: skip
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"`{name}` must be True or False, got {getattr(self, name)!r}")
        if not isinstance(self.dataset, (str, os.PathLike)):
            raise TypeError(f"`dataset` must be a recipe file name, got {self.dataset!r}")
        if self.seeds is not None and not isinstance(self.seeds, (int, bool)):
            object.__setattr__(self, "seeds", check_ints(self.seeds, "seeds", low=0))
        elif self.seeds is not None:
            object.__setattr__(self, "seeds", check_int(self.seeds, "seeds", low=1))
        if self.splits is not None:
            object.__setattr__(self, "splits", check_int(self.splits, "splits", low=0))
        object.__setattr__(self, "tune", check_int(self.tune, "tune", low=0))
        object.__setattr__(self, "tune_split", check_int(self.tune_split, "tune_split", low=0))
        if self.worker and self.tune:
            raise ValueError("`tune` runs on the first machine only; drop it with `worker`")
        if self.tune_only and not self.tune:
            raise ValueError("`tune_only` needs `tune` > 0 and no `worker`")
        check_number(self.poll, "poll", low=0.0, low_open=True)
        check_number(self.plan_timeout, "plan_timeout", low=0.0, low_open=True)
        object.__setattr__(
            self,
            "heartbeat_interval",
            check_int(self.heartbeat_interval, "heartbeat_interval", low=1),
        )
        check_device(self.device, "device")
        if self.storage is not None and (
            not isinstance(self.storage, str) or not self.storage.strip()
        ):
            raise ValueError(f"`storage` must be a SQLAlchemy URL, got {self.storage!r}")
        for name in ("out", "default_out", "checkpoint_dir"):
            if getattr(self, name) is not None:
                check_output_dir(getattr(self, name), name)

    @classmethod
    def from_flags(cls, args: argparse.Namespace, **given: Any) -> SweepOptions:
        """The options of the flags :func:`add_flags` declared, parsed into ``args``
        (a field's ``parse`` applied to its text); ``given`` sets the fields the command
        decides itself (``default_out``) or replaces a flag's value."""
        values = {}
        for f in _flagged():
            value = getattr(args, f.name)
            parse = f.metadata["parse"]
            values[f.name] = parse(value) if parse is not None and value is not None else value
        return cls(**{**values, **given})


def _flagged() -> list[Any]:
    """The fields of :class:`SweepOptions` that have a flag, in declaration order."""
    return [f for f in fields(SweepOptions) if "flag" in f.metadata]


#: ``{field: flag}``: the flag an error about a field names (:func:`bayesurl.commands.name_flags`)
FLAGS: dict[str, str] = {f.name: f.metadata["flag"] for f in _flagged()}


def add_flags(parser: argparse.ArgumentParser, **context: str) -> None:
    """Add a flag per :class:`SweepOptions` field that declares one, to ``parser`` or its
    argument group; the value lands under the field's name, with the field's default.

    ``context`` fills the ``{name}`` placeholders of the helps (``default_out``,
    ``presets``).
    """
    groups: dict[str | None, Any] = {None: parser}
    for f in _flagged():
        meta = f.metadata
        if meta["group"] not in groups:
            groups[meta["group"]] = parser.add_argument_group(meta["group"])
        kwargs = dict(meta["argparse"])
        # an appended flag collects into a fresh list, the field's empty tuple its default
        default = [] if kwargs.get("action") == "append" else f.default
        groups[meta["group"]].add_argument(
            meta["flag"],
            dest=f.name,
            default=default,
            help=meta["help"].format(**context),
            **kwargs,
        )
