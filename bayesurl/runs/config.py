"""Run configurations: typed dataclasses read from one TOML file per data set.

A recipe file ``bayesurl/runs/recipes/<dataset>.toml`` holds

- the data set's defaults: ``[data]``, ``[backbone]``, ``[train]``, ``[eval]`` (the
  :class:`DataConfig`, :class:`BackboneConfig`, :class:`TrainConfig`, :class:`EvalConfig`
  fields) and an optional top-level ``seed``;
- presets, ``[presets.<name>.<section>]``: the benchmark scales (``smoke``, ``quick``,
  ``standard``, ``full``) as overrides of those defaults, each preset's ``sweep`` table
  (class splits, seeds, storage; :class:`bayesurl.sweeps.plan.SweepPreset`) and its optional
  ``tuned`` table (per estimator the settings a ``--tune`` search chose, with the classes they
  were chosen on, ``tuned_on``; one table, or one sub-table per validation set of a
  cross-fitted plan: :func:`tuned_sets`, :func:`preset_tuned`);
- one table per estimator, ``[estimators.<name>]`` or one line ``<name> = { ... }`` under
  ``[estimators]`` (the :class:`EstimatorConfig` fields, plus optional ``train`` / ``eval`` /
  ``backbone`` / ``data`` sub-tables that override the defaults for that estimator only, and
  ``tune``, its own keys of the hyper-parameter search:
  :func:`bayesurl.sweeps.tuning.search_space`). With ``inherit = "estimators"`` the file
  starts from the base table ``recipes/base/estimators.toml`` (every estimator and its
  defaults, declared once, one line each) and states only what differs
  (:func:`inherit_estimators`).

:func:`load_recipe` resolves ``"<dataset>/<estimator>"`` to a :class:`RunConfig`: defaults,
then the preset, then the estimator's own sub-tables, then the preset's tuned settings of the
estimator, then ``--set`` style overrides
(``"train.epochs=5"``, ``"estimator.kwargs.inverse_temperature=8"``). Every key is checked:
an unknown key is a :class:`ValueError` naming it and the valid keys. Values are TOML literals
(``5``, ``1e-3``, ``"adamw"``, ``true``, ``{width = 8}``); ``none`` clears an optional value.
:func:`resolve_tables` resolves tables made in memory (``bayesurl train``'s options) with the
same overrides and checks.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import re
import sys
import types
import typing
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bayesurl._checks import check_int
from bayesurl.backbones import check_backbone_kwargs

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

__all__ = [
    "DEFAULT_RECIPE_FILE",
    "RECIPE_DIR",
    "BackboneConfig",
    "DataConfig",
    "EstimatorConfig",
    "EvalConfig",
    "RunConfig",
    "TrainConfig",
    "apply_overrides",
    "describe_recipes",
    "inherit_estimators",
    "list_recipes",
    "load_recipe",
    "parse_value",
    "TunedSet",
    "preset_tuned",
    "tuned_sets",
    "read_recipe_file",
    "recipe_path",
    "resolve_tables",
    "select_tuned",
]

#: Folder of the shipped recipe files (one per data set).
RECIPE_DIR = Path(__file__).resolve().parent / "recipes"

#: The recipe file a sweep reads when none is named (``bayesurl benchmark`` without
#: ``--dataset``); messages and plots name any other.
DEFAULT_RECIPE_FILE = "fashion_mnist"


@dataclass
class DataConfig:
    """Which zero-shot data and how much of it (URL section 3.2; docs/concepts/zero_shot.rst).

    Attributes
    ----------
    name : str
        ``"fashion_mnist"`` (digits if it is absent), ``"digits"``, ``"cub"``, ``"cars"``,
        ``"sop"`` or ``"imagenet"`` (an ImageFolder ``root/train``, upstream only).
    root : str or None
        Data folder (required for the folder data sets; FashionMNIST is found on its own).
    image_size : int
        Side of the centre crop of folder images (the embedded sets are 28 x 28).
    max_train, max_test, max_ood : int or None
        Class-balanced caps on the upstream training set, the downstream test set (and the
        held-out upstream set), and the OOD set.
    seed : int
        Seed of the subsampling; fixed across training seeds so every seed sees the same
        images.
    how_to_get : str
        Where to get the data (printed when ``root`` is missing).
    downstream_root : str or None
        ``"imagenet"`` only: folder with ``cub/``, ``cars/``, ``sop/`` whose test classes are
        the zero-shot evaluation sets (URL section 3.2).
    class_split : dict or None
        One class split of the embedded sets (``{index, upstream, downstream, val}``, as
        :meth:`bayesurl.data.class_splits.ClassSplit.to_dict`): train on ``upstream``, retrieve
        among ``downstream`` (every image of both files,
        :func:`bayesurl.data.class_splits.split_data`); ``None``: the data set's standard
        zero-shot split. A sweep preset with
        ``splits = N`` sets it per run.
    stage : str
        ``"final"`` or ``"tune"`` (with ``class_split``: train without the validation classes
        and retrieve among them, URL section 3 "Hyperparameters").
    split : {"zero_shot", "closed"}
        The embedded sets' class split (:class:`bayesurl.data.Split`): URL's zero-shot
        upstream / downstream classes, or LAM's closed set (section 4, Table 2: train and
        retrieve on the same classes, :func:`bayesurl.data.closed_set`).
    """

    name: str = "fashion_mnist"
    root: str | None = None
    image_size: int = 28
    max_train: int | None = None
    max_test: int | None = None
    max_ood: int | None = None
    seed: int = 0
    how_to_get: str = ""
    downstream_root: str | None = None
    class_split: dict[str, Any] | None = None
    stage: str = "final"
    split: str = "zero_shot"


@dataclass
class BackboneConfig:
    """The backbone (:func:`bayesurl.backbones.build_backbone`) and embedding size.

    Attributes
    ----------
    name : str
        ``"small_convnet"`` or a timm model name (random weights).
    kwargs : dict
        Constructor arguments (``width`` of the small conv net, timm options).
    checkpoint : str or None
        Local weights file loaded with ``weights_only=True`` (works offline).
    pretrained : bool
        Load the packaged ImageNet weights of a name in
        :data:`bayesurl.backbones.PACKAGED_WEIGHTS` (``efficientnet_lite0`` ...; offline).
    freeze : bool
        Keep the backbone fixed: its features are extracted once into ``cache`` and every
        estimator trains on them (:func:`bayesurl.runs.data.frozen_data`,
        :mod:`bayesurl.features`).
    resolution : int or None
        Side the images are resized to before a frozen backbone (``None``: its input size).
    views : int
        Cached rows per training image with ``freeze``: the plain one and ``views - 1``
        augmentations (the two-view methods draw among these).
    cache : str
        Folder of the frozen-feature store.
    embed_dim : int or None
        Embedding dimension D of the linear projection (``None``: the backbone's features).
    """

    name: str = "small_convnet"
    kwargs: dict[str, Any] = field(default_factory=dict)
    checkpoint: str | None = None
    pretrained: bool = False
    freeze: bool = False
    resolution: int | None = None
    views: int = 3
    cache: str = "runs/features"
    embed_dim: int | None = 64


@dataclass
class TrainConfig:
    """Training of a method or an embedding net (URL section 4, appendix B).

    Attributes
    ----------
    epochs : int
        Epochs (times ``epochs_mult``, at least one).
    epochs_mult : float
        Per-estimator multiplier of ``epochs``.
    batch_size, grad_accum : int
        Micro-batch and micro-batches per optimiser step.
    lr, weight_decay : float
        Peak learning rate and weight decay.
    optimizer : str
        ``"adamw"``, ``"lamb"`` or ``"sgd"`` (:func:`bayesurl.training.fit`).
    warmup_epochs : float
        Linear warm-up before the cosine schedule.
    min_lr : float
        Learning rate the cosine schedule ends at; ``min_lr = lr`` (with no warm-up) keeps the
        rate constant, as LAM's Adam runs do (Warburg et al., 2023, section 5).
    amp : str
        ``"auto"``, ``"off"``, ``"bf16"`` or ``"fp16"``.
    num_workers : int
        Data-loader worker processes.
    """

    epochs: int = 10
    epochs_mult: float = 1.0
    batch_size: int = 128
    grad_accum: int = 1
    lr: float = 1e-3
    weight_decay: float = 0.0
    optimizer: str = "adamw"
    warmup_epochs: float = 0.0
    min_lr: float = 0.0
    amp: str = "auto"
    num_workers: int = 0


@dataclass
class EvalConfig:
    """Evaluation settings (docs/concepts/metrics.rst).

    Attributes
    ----------
    samples : int
        Draws ``S`` per input for the ECE of estimators with an embedding distribution (one
        sampling rule for all: estimators without one always get 0).
    batch_size : int
        Inputs per forward pass.
    metrics : list of str
        Metrics computed beside the evaluator's defaults, by name as
        :class:`bayesurl.evaluation.Evaluator`'s ``include`` takes them: ``["map@r"]`` adds
        MAP@R and R-precision (Musgrave et al., 2020), which are off by default for the cost
        of their R neighbours per query (docs/concepts/metrics.rst).
    """

    samples: int = 10
    batch_size: int = 500
    metrics: list[str] = field(default_factory=list)


@dataclass
class EstimatorConfig:
    """One estimator table ``[estimators.<name>]``.

    Attributes
    ----------
    name : str
        The table's name (the estimator's name in results).
    kind : {"method", "posthoc", "lam", "baseline", "deep_ensemble"}
        A registry method trained by :func:`bayesurl.training.fit`; a post-hoc wrapper
        (:func:`bayesurl.wrap`) on a trained ``base``; LAM (:mod:`bayesurl.laplace`); a free
        ``baseline`` of the input representation (nothing trained); a deep ensemble of
        independently trained copies of the ``base``.
    method : str or None
        Registry name of a ``method`` estimator (default: ``name``).
    base : str or None
        The estimator table a ``posthoc`` estimator wraps, whose trained net a ``lam``
        estimator starts from, or that a ``deep_ensemble`` copies (trained or reused by the
        runner).
    wrapper : str or None
        ``"pvu"``, ``"tau"`` or ``"laplace"`` for ``posthoc``.
    use_base_classifier : bool
        ``posthoc`` Laplace over the base's classifier (laplace-torch last-layer Laplace).
    mode : str
        ``"posthoc"`` or ``"online"`` for ``lam`` (LAM section 3 / eqs. 4-5).
    kwargs : dict
        Constructor options: of the method, of the wrapper, or of
        :func:`bayesurl.laplace.MetricLaplace` (``margin``, ``approximation``, ... and any
        option it accepts, e.g. ``hessian_structure``); ``members`` and ``align`` of a
        ``deep_ensemble``.
    fit : dict
        Options of the post-hoc fit (``epochs``, ``lr``, ``batch_size``); for ``lam``,
        ``optimize_prior`` (default true: the marginal-likelihood prior precision after the
        fit; false keeps ``kwargs.prior_precision``, as LAM does).
    paper : dict
        Reference figures of the papers, stored next to the measured metrics.
    note : str
        One line on where the settings come from.
    """

    name: str = ""
    kind: str = "method"
    method: str | None = None
    base: str | None = None
    wrapper: str | None = None
    use_base_classifier: bool = False
    mode: str = "posthoc"
    kwargs: dict[str, Any] = field(default_factory=dict)
    fit: dict[str, Any] = field(default_factory=dict)
    paper: dict[str, Any] = field(default_factory=dict)
    note: str = ""


@dataclass
class RunConfig:
    """Everything one run needs: data, backbone, training, evaluation, estimator, seed.

    Attributes
    ----------
    dataset : str
        The recipe file's name.
    estimator : EstimatorConfig
    data : DataConfig
    backbone : BackboneConfig
    train : TrainConfig
    eval : EvalConfig
    seed : int
        Training seed (initialisation, batch order, augmentation, ECE draws).
    device : str or None
        ``"cpu"``, ``"cuda"``, ... (``None``: CUDA if available).
    preset : str or None
        Preset applied.
    base : RunConfig or None
        The resolved run of the estimator's ``base`` (same data, seed, overrides).
    source : str
        The recipe file.
    tuned_on : list of int or None
        The classes whose validation scores chose the preset's tuned settings this
        estimator got (``[]``: none applied; ``None``: applied, but the table does not say).
    tuned_trained_on : list of int or None
        The classes that search trained on (transparency; ``None``: not recorded).
    """

    dataset: str
    estimator: EstimatorConfig
    data: DataConfig = field(default_factory=DataConfig)
    backbone: BackboneConfig = field(default_factory=BackboneConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    seed: int = 0
    device: str | None = None
    preset: str | None = None
    base: RunConfig | None = None
    source: str = ""
    tuned_on: list[int] | None = field(default_factory=list)
    tuned_trained_on: list[int] | None = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """Plain-Python (JSON-ready) settings; :meth:`from_dict` reads them back."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> RunConfig:
        """The config of :meth:`to_dict`'s output (e.g. a run's resolved config read back
        from a sweep storage), checked by type and range as a resolved recipe is; nothing is
        resolved again.

        Raises
        ------
        ValueError
            For an unknown key or a value of the wrong type or range (naming it).
        """
        v = dict(values)
        valid = [f.name for f in dataclasses.fields(cls)]
        unknown = [k for k in v if k not in valid]
        if unknown:
            raise ValueError(
                f"unknown key `{unknown[0]}` of a run config; valid: {', '.join(valid)}"
            )
        sections = {s: _build(t, v.get(s, {}), s) for s, t in _SECTIONS.items()}
        tuned = {
            k: None if v.get(k, []) is None else [int(c) for c in v.get(k, [])]
            for k in ("tuned_on", "tuned_trained_on")
        }
        cfg = cls(
            dataset=_check_value(v.get("dataset"), str, "dataset"),
            **sections,
            seed=_check_value(v.get("seed", 0), int, "seed"),
            device=_check_value(v.get("device"), str | None, "device"),
            preset=_check_value(v.get("preset"), str | None, "preset"),
            base=None if v.get("base") is None else cls.from_dict(v["base"]),
            source=_check_value(v.get("source", ""), str, "source"),
            **tuned,
        )
        _validate(cfg)
        return cfg

    @classmethod
    def from_checkpoint(
        cls,
        method: Any,
        *,
        dataset: str,
        estimator: EstimatorConfig | None = None,
        data: DataConfig | None = None,
        train: TrainConfig | None = None,
        seed: int = 0,
        device: str | None = None,
    ) -> RunConfig:
        """The config of a run on a trained method (a checkpoint read by
        :func:`bayesurl.training.load_method_from_checkpoint`): the backbone its
        ``hparams`` name (``small_convnet`` when they name none), the method itself as the
        estimator unless ``estimator`` is given, checked by range as every config is.

        Raises
        ------
        ValueError
            For a value out of range (naming it).
        """
        hp = dict(getattr(method, "hparams", {}) or {})
        backbone = hp.get("backbone")
        cfg = cls(
            dataset=dataset,
            estimator=EstimatorConfig(name=method.name) if estimator is None else estimator,
            data=DataConfig(name=dataset) if data is None else data,
            backbone=BackboneConfig(
                name=backbone if isinstance(backbone, str) else "small_convnet",
                kwargs=dict(hp.get("backbone_kwargs") or {}),
            ),
            train=TrainConfig() if train is None else train,
            seed=seed,
            device=device,
        )
        _validate(cfg)
        return cfg

    @property
    def name(self) -> str:
        """``"<dataset>/<estimator>"``."""
        return f"{self.dataset}/{self.estimator.name}"


_SECTIONS: dict[str, type] = {
    "data": DataConfig,
    "backbone": BackboneConfig,
    "train": TrainConfig,
    "eval": EvalConfig,
    "estimator": EstimatorConfig,
}
_TOP = ("seed", "device")
_FILE_KEYS = (
    "inherit",
    "description",
    "seed",
    "data",
    "backbone",
    "train",
    "eval",
    "presets",
    "estimators",
)

#: Folder of the base tables a recipe file inherits (``inherit = "<name>"``).
BASE_DIR = RECIPE_DIR / "base"


# -- typed construction -----------------------------------------------------------------------
def _check_value(value: Any, hint: Any, where: str, toml_none: bool = True) -> Any:
    """``value`` checked against a field annotation (int, float, str, bool, dict, optional).

    ``toml_none``: the string ``"none"`` stands for ``None`` (TOML has no null); ``False``
    takes Python values as they are (their ``None`` is ``None``, ``"none"`` a string).
    """
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(hint)
        if type(None) in args and (
            value is None or (toml_none and isinstance(value, str) and value.lower() == "none")
        ):
            return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return _check_value(value, a, where, toml_none)
            except ValueError as exc:
                errors.append(str(exc))
        raise ValueError(errors[0])
    if origin is dict or hint is dict:
        if not isinstance(value, Mapping):
            raise ValueError(f"`{where}` must be a table, got {value!r}")
        return {k: _none(v) if toml_none else v for k, v in value.items()}
    if hint is bool:
        if not isinstance(value, bool):
            raise ValueError(f"`{where}` must be true or false, got {value!r}")
        return value
    if hint is int:
        try:
            return check_int(value, where)
        except TypeError as exc:  # a config error is a bad value, whatever its type
            raise ValueError(str(exc)) from None
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"`{where}` must be a number, got {value!r}")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise ValueError(f"`{where}` must be a string, got {value!r}")
        return value
    if origin is list:
        if isinstance(value, str) or not isinstance(value, Sequence):
            raise ValueError(f"`{where}` must be a list, got {value!r}")
        (item,) = typing.get_args(hint)
        return [_check_value(v, item, f"{where}[{i}]", toml_none) for i, v in enumerate(value)]
    return value


def _none(value: Any) -> Any:
    """``"none"`` (TOML has no null) -> ``None``, inside free-form tables too."""
    if isinstance(value, str) and value.lower() == "none":
        return None
    if isinstance(value, Mapping):
        return {k: _none(v) for k, v in value.items()}
    return value


def _build(cls: type, values: Mapping[str, Any], where: str, toml_none: bool = True) -> Any:
    hints = typing.get_type_hints(cls)
    valid = [f.name for f in dataclasses.fields(cls)]
    unknown = [k for k in values if k not in valid]
    if unknown:
        raise ValueError(
            f"unknown key `{where}.{unknown[0]}`; valid keys of [{where}]: {', '.join(valid)}"
        )
    kw = {k: _check_value(v, hints[k], f"{where}.{k}", toml_none) for k, v in values.items()}
    return cls(**kw)


def _merge(dst: dict[str, Any], src: Mapping[str, Any]) -> dict[str, Any]:
    """Deep merge of tables; ``dict`` values (``kwargs``) merge key by key."""
    for k, v in src.items():
        if isinstance(v, Mapping) and isinstance(dst.get(k), dict):
            dst[k] = _merge(dict(dst[k]), v)
        else:
            dst[k] = dict(v) if isinstance(v, Mapping) else v
    return dst


# -- overrides --------------------------------------------------------------------------------
def parse_value(raw: str) -> Any:
    """A ``--set`` value: a TOML value (``5``, ``1e-3``, ``true``, ``"x"``), ``none`` / ``null``
    for ``None``, else the bare word as a string."""
    text = raw.strip()
    if text.lower() in ("none", "null"):
        return None
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text  # a bare word is a string: optimizer=lamb


def _split_override(item: str | tuple[str, Any]) -> tuple[list[str], Any]:
    if isinstance(item, tuple):
        key, value = item
    else:
        if "=" not in item:
            raise ValueError(f"`--set` expects KEY=VALUE (e.g. train.epochs=5), got {item!r}")
        key, raw = item.split("=", 1)
        value = parse_value(raw)
    parts = [p.strip() for p in str(key).split(".") if p.strip()]
    if not parts:
        raise ValueError(f"`--set` has an empty key in {item!r}")
    return parts, value


def apply_overrides(
    tables: dict[str, Any], overrides: Iterable[str | tuple[str, Any]]
) -> dict[str, Any]:
    """Apply ``"a.b=v"`` overrides to a ``{section: table}`` dict (checked later by type).

    Raises
    ------
    ValueError
        For a malformed item or an unknown section / key (naming it and the valid ones).
    """
    for item in overrides:
        parts, value = _split_override(item)
        head = parts[0]
        if len(parts) == 1:
            if head not in _TOP:
                valid = [*_TOP, *(f"{s}.<key>" for s in _SECTIONS)]
                raise ValueError(f"unknown key `{head}` in --set; valid keys: {', '.join(valid)}")
            tables[head] = value
            continue
        if head not in _SECTIONS:
            raise ValueError(
                f"unknown section `{head}` in --set {'.'.join(parts)}; valid: "
                f"{', '.join([*_TOP, *_SECTIONS])}"
            )
        cls = _SECTIONS[head]
        valid = [f.name for f in dataclasses.fields(cls)]
        if parts[1] not in valid:
            raise ValueError(
                f"unknown key `{head}.{parts[1]}`; valid keys of [{head}]: {', '.join(valid)}"
            )
        node = tables.setdefault(head, {})
        for p in parts[1:-1]:
            nxt = node.get(p)
            if not isinstance(nxt, dict):
                nxt = {}
                node[p] = nxt
            node = nxt
        node[parts[-1]] = value
    return tables


# -- files ------------------------------------------------------------------------------------
def recipe_path(dataset: str | Path) -> Path:
    """The TOML file of ``dataset`` (a shipped name or a path to a ``.toml`` file).

    Raises
    ------
    ValueError
        For an unknown name (the message lists the shipped ones).
    FileNotFoundError
        For a ``.toml`` path that does not exist.
    """
    text = str(dataset)
    if text.endswith(".toml"):
        p = Path(text)
        if not p.is_file():
            raise FileNotFoundError(f"recipe file {text!r} does not exist")
        return p
    p = RECIPE_DIR / f"{text.lower().replace('-', '_')}.toml"
    if not p.is_file():
        names = sorted(f.stem for f in RECIPE_DIR.glob("*.toml"))
        raise ValueError(f"unknown dataset {text!r} in the recipe; valid: {', '.join(names)}")
    return p


def read_recipe_file(dataset: str | Path) -> dict[str, Any]:
    """The raw tables of a recipe file, with its top-level keys checked.

    Raises
    ------
    ValueError
        For a file that is not valid TOML or holds an unknown top-level key.
    """
    p = recipe_path(dataset)
    try:
        raw = tomllib.loads(p.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"recipe file {str(p)!r} is not valid TOML: {exc}") from None
    _refuse_tune_tables(raw, p.name)
    unknown = [k for k in raw if k not in _FILE_KEYS]
    if unknown:
        raise ValueError(
            f"unknown key `{unknown[0]}` in {p.name}; valid top-level keys: {', '.join(_FILE_KEYS)}"
        )
    if "inherit" in raw:
        raw["estimators"] = inherit_estimators(raw["inherit"], raw.get("estimators", {}), p.name)
    if not isinstance(raw.get("estimators"), dict) or not raw["estimators"]:
        raise ValueError(f"recipe file {p.name} has no [estimators.<name>] table")
    return raw


def _refuse_tune_tables(raw: Mapping[str, Any], where: str) -> None:
    """A search space is a key of its estimator's table, not a ``[tune.<name>]`` table."""
    if "tune" in raw:
        name = next(iter(raw["tune"]), "<name>") if isinstance(raw["tune"], dict) else "<name>"
        raise ValueError(
            f"[tune.{name}] in {where}: a search space is the `tune` key of its estimator's "
            f'table, e.g. `{name} = {{ note = "...", tune = {{ "estimator.kwargs.x" = '
            f'["float", 0.1, 1.0] }} }}` under [estimators]'
        )


def inherit_estimators(
    base: str, own: Mapping[str, Any], where: str = "recipe"
) -> dict[str, dict[str, Any]]:
    """The estimator tables of ``BASE_DIR/<base>.toml`` with a file's own tables on top.

    A key of the file's table replaces the base's, ``kwargs`` (and other sub-tables) merge
    key by key; a name the base does not hold is added after the base's names.

    Raises
    ------
    ValueError
        For an unknown base name (listing the shipped ones) or a base file that is not TOML.
    """
    path = BASE_DIR / f"{base}.toml"
    if not isinstance(base, str) or not path.is_file():
        names = sorted(f.stem for f in BASE_DIR.glob("*.toml"))
        raise ValueError(f"unknown `inherit` {base!r} in {where}; valid: {', '.join(names)}")
    try:
        base_raw = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"base table {str(path)!r} is not valid TOML: {exc}") from None
    _refuse_tune_tables(base_raw, path.name)
    tables = base_raw.get("estimators", {})
    if not isinstance(own, Mapping):
        raise ValueError(f"`estimators` of {where} must be tables [estimators.<name>]")
    merged = {name: dict(t) for name, t in tables.items()}
    for name, table in own.items():
        merged[name] = _merge(merged.get(name, {}), table)
    return merged


def list_recipes() -> dict[str, list[str]]:
    """``{dataset: [estimator, ...]}`` of every shipped recipe file."""
    return {
        f.stem: list(read_recipe_file(f.stem)["estimators"])
        for f in sorted(RECIPE_DIR.glob("*.toml"))
    }


def _split_name(name: str) -> tuple[str, str]:
    text = str(name).strip()
    if text.count("/") < 1:
        raise ValueError(f"a recipe is named `<dataset>/<estimator>`, got {name!r}")
    dataset, estimator = text.rsplit("/", 1)
    return dataset, estimator.lower()


@dataclass(frozen=True)
class TunedSet:
    """One table of tuned settings a preset commits.

    Attributes
    ----------
    name : str
        The sub-table's name (``""``: the flat ``[presets.<name>.tuned]`` table).
    tuned_on : tuple of int or None
        The validation classes whose scores chose the settings (``None``: not recorded).
    trained_on : tuple of int or None
        The classes the search trained on.
    table : dict
        ``{estimator: ["key=value", ...]}``.
    """

    name: str
    tuned_on: tuple[int, ...] | None
    trained_on: tuple[int, ...] | None
    table: dict[str, list[str]]


_SET_KEYS = ("tuned_on", "trained_on")


def _tuned_table(
    raw: Mapping[str, Any], table: Mapping[str, Any], key: str
) -> tuple[dict[str, list[str]], dict[str, tuple[int, ...] | None]]:
    out: dict[str, list[str]] = {}
    classes: dict[str, tuple[int, ...] | None] = {k: None for k in _SET_KEYS}
    for name, items in table.items():
        if name in _SET_KEYS:
            if not isinstance(items, list) or not all(
                isinstance(c, int) and not isinstance(c, bool) for c in items
            ):
                raise ValueError(f"`{key}.{name}` must be a list of class indices")
            classes[name] = tuple(sorted(items))
            continue
        if name not in raw["estimators"]:
            valid = ", ".join(raw["estimators"])
            raise ValueError(f"`{key}` names unknown estimator {name!r}; valid: {valid}")
        if not isinstance(items, list) or not all(isinstance(o, str) for o in items):
            raise ValueError(f'`{key}.{name}` must be a list of "key=value" strings')
        out[name] = list(items)
    return out, classes


def tuned_sets(raw: Mapping[str, Any], preset: str | None, where: str) -> list[TunedSet]:
    """The tuned settings a preset commits, checked: one :class:`TunedSet` per table.

    ``[presets.<name>.tuned]`` maps an estimator to the ``"key=value"`` overrides that
    :func:`bayesurl.sweeps.tuning.tune_estimators` chose for it (``tuned.toml`` of a ``--tune``
    sweep), with ``tuned_on`` (the validation classes) and ``trained_on`` (the classes the
    search trained on). A cross-fitted plan commits one sub-table per validation set,
    ``[presets.<name>.tuned.<set>]``, each with its own ``tuned_on``; a run takes the set
    tuned on classes of its own upstream side (:func:`preset_tuned`).

    Raises
    ------
    ValueError
        If a table is not ``{estimator: [str, ...]}``, names an estimator the recipe does not
        hold, a sub-table lacks ``tuned_on``, or two sets share a class.
    """
    if preset is None:
        return []
    table = raw.get("presets", {}).get(preset, {}).get("tuned", {})
    key = f"presets.{preset}.tuned"
    if not isinstance(table, Mapping):
        raise ValueError(f"`{key}` in {where} must be a table {{estimator = [overrides]}}")
    if not table:
        return []
    nested = [k for k, v in table.items() if isinstance(v, Mapping)]
    if not nested:
        est, cl = _tuned_table(raw, table, key)
        return [TunedSet("", cl["tuned_on"], cl["trained_on"], est)]
    if len(nested) != len(table):
        flat = [k for k in table if k not in nested]
        raise ValueError(
            f"`{key}` mixes sub-tables ({', '.join(nested)}) with flat entries "
            f"({', '.join(flat)}); put every entry in a sub-table with its `tuned_on`"
        )
    sets = []
    seen: set[int] = set()
    for name in nested:
        est, cl = _tuned_table(raw, table[name], f"{key}.{name}")
        if cl["tuned_on"] is None:
            raise ValueError(f"`{key}.{name}` needs `tuned_on` (its validation classes)")
        if seen & set(cl["tuned_on"]):
            raise ValueError(f"`{key}` sets share classes {sorted(seen & set(cl['tuned_on']))}")
        seen |= set(cl["tuned_on"])
        sets.append(TunedSet(name, cl["tuned_on"], cl["trained_on"], est))
    return sets


def select_tuned(
    sets: list[TunedSet], class_split: Mapping[str, Any] | None, where: str
) -> TunedSet | None:
    """The set of ``sets`` a run on ``class_split`` uses (``None``: there is none).

    One set whose ``tuned_on`` is unrecorded is used as it is (its runs then record
    ``tuned_on = None`` and a report cannot rule a leak out). Otherwise the run takes the set
    whose ``tuned_on`` lies in its upstream classes (the split's ``val`` first).

    Raises
    ------
    ValueError
        When several sets exist and no class split says which, or when no set's classes lie
        upstream (every set would have chosen the settings on a downstream class).
    """
    if not sets:
        return None
    if len(sets) == 1 and sets[0].tuned_on is None:
        return sets[0]
    if class_split is None:
        if len(sets) == 1:
            return sets[0]
        raise ValueError(
            f"the tuned settings of {where} come in {len(sets)} sets tuned on different classes "
            f"({'; '.join(str(list(t.tuned_on or ())) for t in sets)}): give a "
            "`data.class_split` whose upstream classes hold one set's, or run the defaults "
            "(`bayesurl benchmark --untuned`, `load_recipe(..., tuned=False)`)"
        )
    up = {int(c) for c in class_split.get("upstream", ())}
    val = tuple(sorted(int(c) for c in class_split.get("val", ())))
    fit = [t for t in sets if t.tuned_on is not None and set(t.tuned_on) <= up]
    same = [t for t in fit if t.tuned_on == val]
    if same or fit:
        return (same or fit)[0]
    raise ValueError(
        f"no tuned set of {where} was tuned on upstream classes of the split {sorted(up)} "
        f"(sets: {'; '.join(str(list(t.tuned_on or ())) for t in sets)}): its settings would "
        "have been chosen on a downstream class; run the defaults (--untuned) or tune on this "
        "split (--tune)"
    )


def preset_tuned(
    raw: Mapping[str, Any],
    preset: str | None,
    where: str,
    class_split: Mapping[str, Any] | None = None,
) -> dict[str, list[str]]:
    """The tuned settings a preset commits for a run on ``class_split``, checked.

    They apply after the estimator's own tables and before ``--set``; a post-hoc or LAM
    row's base takes its own tuned entry, so it is the same net as the base's row. With
    several sets (:func:`tuned_sets`) the split picks one (:func:`select_tuned`).

    Raises
    ------
    ValueError
        As :func:`tuned_sets` and :func:`select_tuned`.
    """
    chosen = select_tuned(tuned_sets(raw, preset, where), class_split, where)
    return {} if chosen is None else dict(chosen.table)


def _resolve(
    raw: dict[str, Any],
    dataset: str,
    estimator: str,
    preset: str | None,
    overrides: list[str | tuple[str, Any]],
    source: str,
    *,
    base_of: str | None = None,
    tuned: bool = True,
) -> RunConfig:
    estimators = raw["estimators"]
    if estimator not in estimators:
        what = f"`estimator.base` of {base_of!r}" if base_of else "estimator"
        raise ValueError(
            f"unknown {what} {estimator!r} in {dataset}; valid: {', '.join(estimators)}"
        )
    tables: dict[str, Any] = {
        s: dict(raw.get(s, {})) for s in ("data", "backbone", "train", "eval")
    }
    if "seed" in raw:
        tables["seed"] = raw["seed"]
    if preset is not None:
        presets = raw.get("presets", {})
        if preset not in presets:
            raise ValueError(
                f"unknown `preset` {preset!r} for {dataset}; valid presets: {', '.join(presets)}"
            )
        for section, table in presets[preset].items():
            if section in ("sweep", "tuned"):  # the sweep's plan and its tuned settings
                continue
            if section not in ("data", "backbone", "train", "eval"):
                raise ValueError(
                    f"unknown section `presets.{preset}.{section}`; valid: data, backbone, "
                    "train, eval, sweep, tuned"
                )
            tables[section] = _merge(tables[section], table)
    est = dict(estimators[estimator])
    # the estimator's search space: the sweep's (bayesurl.sweeps.tuning.search_space), no
    # setting of a run
    est.pop("tune", None)
    for section in ("data", "backbone", "train", "eval"):
        if section in est:
            tables[section] = _merge(tables[section], est.pop(section))
    est["name"] = estimator
    tables["estimator"] = est
    own = [o for o in overrides if not _split_override(o)[0][0] == "estimator"]
    tset = None
    if tuned:
        sets = tuned_sets(raw, preset, dataset)
        if sets:  # the run's class split (after the overrides) picks the set
            probe = apply_overrides(copy.deepcopy(tables), overrides if base_of is None else own)
            tset = select_tuned(sets, probe["data"].get("class_split"), dataset)
    chosen = [] if tset is None else tset.table.get(estimator, [])
    apply_overrides(tables, [*chosen, *(overrides if base_of is None else own)])
    where = f"estimators.{estimator}"
    cfg = _typed(tables, dataset=dataset, preset=preset, source=source)
    est_cfg, kind = cfg.estimator, cfg.estimator.kind
    if chosen and tset is not None:
        cfg.tuned_on = None if tset.tuned_on is None else list(tset.tuned_on)
        cfg.tuned_trained_on = None if tset.trained_on is None else list(tset.trained_on)
    if kind == "posthoc" and (not est_cfg.base or not est_cfg.wrapper):
        raise ValueError(f"[{where}] of kind 'posthoc' needs `base` and `wrapper`")
    if est_cfg.base and kind == "method":
        raise ValueError(f"[{where}] of kind 'method' has no `base`")
    if est_cfg.base:
        if base_of is not None:
            raise ValueError(f"[{where}] is the base of {base_of!r} and cannot have a base itself")
        cfg.base = _resolve(
            raw, dataset, est_cfg.base, preset, overrides, source, base_of=estimator, tuned=tuned
        )
        if cfg.base.estimator.kind != "method":
            raise ValueError(f"`{where}.base` {est_cfg.base!r} must be of kind 'method'")
    return cfg


#: The names of :class:`bayesurl.training.optim.OptimizerName` and
#: :class:`bayesurl.training.AmpMode`, written out so that checking a config does not import
#: torch (a test keeps them equal).
OPTIMIZER_NAMES = ("adam", "adamw", "lamb", "sgd")
AMP_MODES = ("auto", "off", "bf16", "fp16")


def _validate(cfg: RunConfig) -> None:
    """Range checks of the typed values, once, where the config is made."""
    t, e, b = cfg.train, cfg.eval, cfg.backbone
    for where, value in (
        ("train.epochs", t.epochs),
        ("train.batch_size", t.batch_size),
        ("train.grad_accum", t.grad_accum),
        ("eval.batch_size", e.batch_size),
        ("data.image_size", cfg.data.image_size),
        ("backbone.views", b.views),
        ("backbone.resolution", 1 if b.resolution is None else b.resolution),
    ):
        if value < 1:
            raise ValueError(f"`{where}` must be >= 1, got {value}")
    for where, value in (("train.lr", t.lr), ("train.epochs_mult", t.epochs_mult)):
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"`{where}` must be a positive number, got {value}")
    for where, value in (
        ("train.weight_decay", t.weight_decay),
        ("train.warmup_epochs", t.warmup_epochs),
        ("train.min_lr", t.min_lr),
    ):
        if not (math.isfinite(value) and value >= 0):
            raise ValueError(f"`{where}` must be >= 0, got {value}")
    if t.num_workers < 0:
        raise ValueError(f"`train.num_workers` must be >= 0, got {t.num_workers}")
    if e.samples < 0:
        raise ValueError(f"`eval.samples` must be >= 0, got {e.samples}")
    if e.metrics:  # the metric table imports torch: read only when a config asks for more
        from bayesurl.evaluation.table import METRICS

        unknown = [m for m in e.metrics if m not in METRICS]
        if unknown:
            raise ValueError(
                f"`eval.metrics`: unknown metric {unknown[0]!r}; valid: {', '.join(METRICS)}"
            )
    if b.embed_dim is not None and b.embed_dim < 1:
        raise ValueError(f"`backbone.embed_dim` must be >= 1 or none, got {b.embed_dim}")
    try:  # bayesurl's own backbones: a bad width fails here, named, not in the first batch
        check_backbone_kwargs(b.name, dict(b.kwargs))
    except (ValueError, TypeError) as exc:
        raise ValueError(re.sub(r"`(\w+)`", r"`backbone.kwargs.\1`", str(exc))) from None
    if t.optimizer.lower() not in OPTIMIZER_NAMES:
        raise ValueError(
            f"unknown `train.optimizer` {t.optimizer!r}; valid: {', '.join(OPTIMIZER_NAMES)}"
        )
    if t.amp.lower() not in AMP_MODES:
        raise ValueError(f"unknown `train.amp` {t.amp!r}; valid: {', '.join(AMP_MODES)}")
    if cfg.seed < 0:
        raise ValueError(f"`seed` must be >= 0, got {cfg.seed}")


def _typed(
    tables: Mapping[str, Any],
    *,
    dataset: str,
    preset: str | None,
    source: str,
    toml_none: bool = True,
) -> RunConfig:
    """The typed, range-checked :class:`RunConfig` of resolved ``{section: table}`` tables.

    The one place a run config is built from tables, for a recipe (:func:`_resolve`) and for
    tables made in memory (:func:`resolve_tables`).
    """
    where = f"estimators.{tables['estimator'].get('name', '')}"
    est_cfg: EstimatorConfig = _build(EstimatorConfig, tables["estimator"], where, toml_none)
    # the kinds register themselves in modules that import this one: looked up at call time
    from bayesurl.runs.estimators import ESTIMATORS

    est_cfg.kind = ESTIMATORS.entry(est_cfg.kind, argument=f"{where}.kind").name
    sections = {s: tables.get(s, {}) for s in ("data", "backbone", "train", "eval")}
    cfg = RunConfig(
        dataset=dataset,
        estimator=est_cfg,
        **{s: _build(_SECTIONS[s], t, s, toml_none) for s, t in sections.items()},
        seed=_check_value(tables.get("seed", 0), int, "seed"),
        device=_check_value(tables.get("device"), str | None, "device", toml_none),
        preset=preset,
        source=source,
    )
    _validate(cfg)
    return cfg


def resolve_tables(
    tables: Mapping[str, Any],
    overrides: Iterable[str | tuple[str, Any]] = (),
    *,
    dataset: str,
    toml_none: bool = True,
) -> RunConfig:
    """A :class:`RunConfig` from tables made in memory instead of read from a recipe file.

    The same overrides, type and range checks as :func:`load_recipe`: the dataclasses'
    defaults, then ``tables`` (``{"train": {"epochs": 5}, "seed": 1, "estimator": {...}}``),
    then ``overrides`` in order (a later one wins). ``bayesurl train --method`` resolves its
    options this way.

    Parameters
    ----------
    tables : mapping
        ``{section: table}`` with the sections ``data``, ``backbone``, ``train``, ``eval``,
        ``estimator`` and the top-level ``seed`` / ``device``; not modified.
    overrides : iterable of str or (key, value)
        ``"train.epochs=5"`` or ``("train.epochs", 5)``, applied after ``tables``.
    dataset : str
        :attr:`RunConfig.dataset`.
    toml_none : bool
        Read the string ``"none"`` as ``None``, as in a TOML file (which has no null);
        ``False`` takes the values as they are, so ``"none"`` stays a string (a method
        option such as SNGP's ``spectral_norm="none"``).

    Returns
    -------
    RunConfig

    Raises
    ------
    ValueError
        For an unknown section or key (naming it and the valid ones), a value of the wrong
        type or out of range (naming its key, e.g. ``train.epochs``).
    """
    resolved = apply_overrides(copy.deepcopy(dict(tables)), overrides)
    resolved.setdefault("estimator", {})
    return _typed(resolved, dataset=dataset, preset=None, source="", toml_none=toml_none)


def load_recipe(
    name: str,
    overrides: Iterable[str | tuple[str, Any]] = (),
    *,
    preset: str | None = None,
    tuned: bool = True,
    recipe: Mapping[str, Any] | None = None,
) -> RunConfig:
    """Read ``"<dataset>/<estimator>"`` into a :class:`RunConfig`.

    Parameters
    ----------
    name : str
        ``"fashion_mnist/elk"``; the dataset part may be a path to a ``.toml`` file
        (``"my/recipes.toml/elk"``).
    overrides : iterable of str or (key, value)
        ``"train.epochs=5"`` style, applied last. ``estimator.*`` keys change only the named
        estimator, the others also its post-hoc base.
    preset : str, optional
        A ``[presets.<name>]`` of the file (``"smoke"``, ``"quick"``, ``"full"``).
    tuned : bool
        Apply the preset's committed tuned settings (``[presets.<name>.tuned]``,
        :func:`preset_tuned`); ``False`` gives the recipe's default settings.
    recipe : mapping, optional
        The file's tables as :func:`read_recipe_file` gave them, for a caller that resolves
        many runs of one file (a sweep reads it once); default: the file is read. Not
        modified.

    Returns
    -------
    RunConfig

    Raises
    ------
    ValueError
        For an unknown dataset, estimator, preset, section or key (the message names it and
        lists the valid ones) or a value of the wrong type.
    """
    dataset, estimator = _split_name(name)
    # the overrides write into nested tables: a caller's tables are copied, not changed
    raw = read_recipe_file(dataset) if recipe is None else copy.deepcopy(dict(recipe))
    path = recipe_path(dataset)
    ds_name = path.stem if str(dataset).endswith(".toml") else str(dataset).lower()
    return _resolve(raw, ds_name, estimator, preset, list(overrides), str(path), tuned=tuned)


def _fmt_value(v: Any) -> str:
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k} = {_fmt_value(x)}" for k, x in v.items()) + "}"
    if isinstance(v, str):
        return f'"{v}"'
    if isinstance(v, bool):
        return "true" if v else "false"
    return repr(v)


def _table_line(table: Mapping[str, Any]) -> str:
    return ", ".join(f"``{k} = {_fmt_value(v)}``" for k, v in table.items()) or "--"


def describe_recipes() -> str:
    """reStructuredText listing every dataset x estimator config of the recipe files.

    Generated from the TOML files (the docs build calls it), so the page cannot drift from
    the configs: per data set its defaults and presets, and one row per estimator table.
    """
    lines = [
        ".. This file is generated from bayesurl/runs/recipes/*.toml by docs/conf.py.",
        "",
        "Every recipe config",
        "===================",
        "",
        "Generated from the recipe files ``bayesurl/runs/recipes/<dataset>.toml``; run any row "
        "with ``bayesurl run <dataset>/<estimator>`` (add ``--preset`` and ``--set``).",
        "",
    ]
    for dataset in list_recipes():
        raw = read_recipe_file(dataset)
        title = f"``{dataset}``"
        lines += [title, "-" * len(title), "", str(raw.get("description", "")), ""]
        lines += [".. list-table::", "   :header-rows: 1", "   :widths: 14 86", ""]
        lines += ["   * - section", "     - defaults"]
        for section in ("data", "backbone", "train", "eval"):
            lines += [f"   * - ``[{section}]``", f"     - {_table_line(raw.get(section, {}))}"]
        for name, preset in raw.get("presets", {}).items():
            parts = "; ".join(f"{k}: {_table_line(v)}" for k, v in preset.items())
            lines += [f"   * - preset ``{name}``", f"     - {parts}"]
        lines += ["", ".. list-table::", "   :header-rows: 1", "   :widths: 16 12 36 36", ""]
        lines += ["   * - estimator", "     - kind", "     - settings", "     - note"]
        for name, table in raw["estimators"].items():
            t = dict(table)
            kind = t.pop("kind", "method")
            note = t.pop("note", "")
            t.pop("tune", None)  # the sweep's search space, not a setting of the run
            paper = t.pop("paper", None)
            if paper:
                src = paper.get("source", "paper")
                figs = ", ".join(f"{k} {v}" for k, v in paper.items() if k != "source")
                note = f"{note} (reference: {src}: {figs})"
            lines += [
                f"   * - ``{dataset}/{name}``",
                f"     - {kind}",
                f"     - {_table_line(t)}",
                f"     - {note or '--'}",
            ]
        lines.append("")
    return "\n".join(lines) + "\n"
