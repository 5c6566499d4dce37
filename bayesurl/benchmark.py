"""The main job: train every URL method on the embedded zero-shot default and compare them.

This is a small, offline instance of the URL benchmark (Kirchhof et al., 2023): every method
(URL section 4.1 and appendix B) is trained on the upstream classes with its recipe and
evaluated zero-shot on the downstream classes (URL section 3.2) with the sampling-aware
evaluator (:mod:`bayesurl.evaluation`; metrics in spec METRICS.md):

* **R@1** and **R-AUROC** (URL section 3.1): retrieval quality and how well u(x) predicts an
  R@1 error on the downstream test set;
* **AUSC** (LAM, Warburg et al., 2023, section 5): area under the sparsification curve;
* **ECE** (LAM section 5) for methods that define an embedding distribution
  (``Method.has_distribution``): computed from ``S`` posterior draws. Methods with only a
  scalar u report ``None`` -- never a made-up number;
* **OOD AUROC** (DATA.md): u on foreign data (digits) against u on held-out upstream data
  (``ZeroShotData.id_test``);
* the wall-clock **training time** (URL reports train step costs in section 4.2).

Data: :func:`bayesurl.data.default_zero_shot` (FashionMNIST, upstream classes 0-4, downstream
5-9, OOD = digits; digits alone if FashionMNIST is absent). The subsample sizes are fixed by
the preset and drawn with data seed 0, so every training seed sees the same images; the seeds
vary initialisation, batch order and augmentation.

Entry points: :func:`run_benchmark` (library) and ``bayesurl benchmark`` (command line).

>>> from bayesurl.benchmark import run_benchmark  # doctest: +SKIP
>>> res = run_benchmark(["ce", "mcinfonce"], seeds=(0, 1, 2), preset="quick",
...                     out="runs/benchmark")  # doctest: +SKIP
>>> print(res.table())  # doctest: +SKIP
"""

from __future__ import annotations

import csv
import json
import math
import os
import platform
import time
import traceback
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from bayesurl.types import Output

__all__ = [
    "METRICS",
    "PRESETS",
    "RECIPES",
    "BenchmarkResults",
    "Preset",
    "Recipe",
    "embed",
    "evaluate_checkpoint",
    "evaluate_method",
    "get_preset",
    "input_channels",
    "merge_results",
    "recipe_for",
    "resolve_methods",
    "run_benchmark",
]

#: Metrics of the benchmark table: ``(result key, column title)``.
METRICS: tuple[tuple[str, str], ...] = (
    ("r@1", "R@1"),
    ("r_auroc", "R-AUROC"),
    ("ausc", "AUSC"),
    ("ece", "ECE"),
    ("ood_auroc", "OOD AUROC"),
    ("train_time", "train [s]"),
)

#: Further numbers kept per run and aggregated (JSON / CSV), not shown in the table.
EXTRA_METRICS: tuple[str, ...] = (
    "ause",
    "ood_auprc",
    "map@5",
    "eval_time",
    "train_cpu_time",
    "final_loss",
)


@dataclass(frozen=True)
class Preset:
    """Data sizes and the shared training settings of one benchmark scale.

    Parameters
    ----------
    name : str
        Preset name.
    max_train : int or None
        Class-balanced cap on the upstream training images (``None``: all 30,000).
    max_test : int or None
        Cap on the downstream test set and on the held-out upstream set each.
    max_ood : int or None
        Cap on the OOD set.
    epochs : int
        Training epochs (times each method's :attr:`Recipe.epochs_mult`).
    batch_size : int
        Batch size (two-view methods see two views of each image).
    embed_dim : int
        Embedding dimension D.
    backbone : str
        ``"small_convnet"`` or a timm model name (random init).
    backbone_kwargs : dict
        Constructor arguments of the backbone (e.g. ``width`` of the small conv net).
    optimizer : str
        ``"adamw"``, ``"lamb"`` or ``"sgd"`` (:func:`bayesurl.training.fit`).
    warmup_epochs : float
        Linear warm-up before the cosine schedule.
    eval_samples : int
        Draws ``S`` per input for the ECE of methods with a distribution.
    eval_batch_size : int
        Images per forward pass when embedding the evaluation sets.
    """

    name: str
    max_train: int | None
    max_test: int | None
    max_ood: int | None
    epochs: int
    batch_size: int
    embed_dim: int = 64
    backbone: str = "small_convnet"
    backbone_kwargs: Mapping[str, Any] = field(default_factory=dict)
    optimizer: str = "adamw"
    warmup_epochs: float = 0.25
    eval_samples: int = 10
    eval_batch_size: int = 500


#: The benchmark scales. ``quick`` runs every method in <= 10 minutes on 2 CPU cores;
#: ``full`` uses all upstream images and trains longer (for a GPU or a patient user);
#: ``smoke`` is a seconds-long run for tests.
PRESETS: dict[str, Preset] = {
    "smoke": Preset(
        "smoke",
        max_train=200,
        max_test=150,
        max_ood=80,
        epochs=1,
        batch_size=50,
        embed_dim=16,
        backbone_kwargs={"width": 8, "num_features": 32},
        eval_samples=4,
        warmup_epochs=0.0,
    ),
    "quick": Preset(
        "quick",
        max_train=4000,
        max_test=2000,
        max_ood=1000,
        epochs=3,
        batch_size=128,
        embed_dim=64,
        eval_samples=10,
    ),
    "full": Preset(
        "full",
        max_train=None,
        max_test=None,
        max_ood=None,
        epochs=20,
        batch_size=256,
        embed_dim=128,
        backbone_kwargs={"width": 64, "num_features": 256},
        eval_samples=20,
        warmup_epochs=1.0,
    ),
}


@dataclass(frozen=True)
class Recipe:
    """Per-method training settings on top of a :class:`Preset`.

    Parameters
    ----------
    lr : float
        Peak learning rate.
    epochs_mult : float
        Multiplier of the preset's epochs (at least one epoch is trained).
    weight_decay : float
        Weight decay.
    kwargs : dict
        Constructor arguments of the method (URL appendix B hyper-parameters), on top of
        ``backbone``, ``embed_dim``, ``num_classes`` and ``backbone_kwargs``.
    eval_samples : int or None
        Overrides the preset's number of draws for the ECE.
    """

    lr: float = 1e-3
    epochs_mult: float = 1.0
    weight_decay: float = 0.0
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    eval_samples: int | None = None


#: One recipe per method (URL appendix B for the method hyper-parameters, scaled down to a
#: small conv net trained from scratch). Methods registered later without an entry get
#: ``Recipe()``.
RECIPES: dict[str, Recipe] = {
    "ce": Recipe(lr=1e-3),
    # B.2: inverse temperature in [8, 64]
    "infonce": Recipe(lr=1e-3, kwargs={"inverse_temperature": 16.0}),
    # B.3 / MCI eq. 7: K samples per view, reference-code denominator
    "mcinfonce": Recipe(lr=1e-3, kwargs={"inverse_temperature": 16.0, "n_samples": 16}),
    # B.4: analytic expected likelihood kernel, proxies scaled by kappa
    "elk": Recipe(lr=1e-3),
    # B.5: 16 MC samples of the non-isotropic proxies
    "nivmf": Recipe(lr=1e-3, kwargs={"n_samples": 16}),
    # B.6: match probability from samples; 8 samples keep the pairwise term cheap on CPU
    "hib": Recipe(lr=1e-3, kwargs={"n_samples": 8}),
    # B.7: rank-1 + diagonal Gaussian, 16 MC draws of the softmax
    "hetxl": Recipe(lr=1e-3, kwargs={"rank": 1, "n_mc": 16}),
    # B.8: random-feature GP output layer
    "sngp": Recipe(lr=1e-3),
    # B.9: loss-prediction weight lambda
    "losspred": Recipe(lr=1e-3, kwargs={"lam": 0.04}),
    # B.10: 10 heads on a shared backbone
    "ensemble": Recipe(lr=1e-3, kwargs={"num_heads": 10}),
    # B.11 (head-only dropout): 10 passes at inference
    "mcdropout": Recipe(lr=1e-3, kwargs={"p": 0.1, "n_passes": 10}),
    # TaU Algorithm 1: temperature floor 0.1
    "tau": Recipe(lr=1e-3, kwargs={"scale": 0.1}),
}


def get_preset(preset: str | Preset) -> Preset:
    """The :class:`Preset` named ``preset`` (or ``preset`` itself).

    Raises
    ------
    ValueError
        If the name is unknown; the message lists the valid ones.
    """
    if isinstance(preset, Preset):
        return preset
    key = str(preset).lower()
    if key not in PRESETS:
        raise ValueError(f"unknown `preset` {preset!r}; valid presets: {', '.join(PRESETS)}")
    return PRESETS[key]


def recipe_for(name: str) -> Recipe:
    """The training :class:`Recipe` of method ``name`` (``Recipe()`` if it has none)."""
    return RECIPES.get(str(name).lower(), Recipe())


def resolve_methods(methods: str | Iterable[str] | None) -> list[str]:
    """Validate method names against the registry (:func:`bayesurl.methods.available`).

    Parameters
    ----------
    methods : str, iterable of str or None
        Names (a comma-separated string is split); ``None`` or ``"all"`` means every
        registered method.

    Returns
    -------
    list of str
        Lower-case registry names, in the given order, without duplicates.

    Raises
    ------
    ValueError
        If a name is unknown (the message lists the valid names) or the list is empty.
    """
    from bayesurl.methods import available

    valid = available()
    if methods is None:
        return valid
    if isinstance(methods, str):
        methods = [m for m in methods.split(",")]
    names = [str(m).strip().lower() for m in methods if str(m).strip()]
    if names == ["all"]:
        return valid
    if not names:
        raise ValueError(f"`methods` is empty; valid names: {', '.join(valid)}")
    unknown = [n for n in names if n not in valid]
    if unknown:
        raise ValueError(
            f"unknown method(s) {', '.join(repr(u) for u in unknown)} in `methods`; "
            f"valid names: {', '.join(valid)}"
        )
    return list(dict.fromkeys(names))


def input_channels(backbone: Any) -> int:
    """Image channels a backbone expects: 1 for ``"small_convnet"``, 3 for timm models.

    The grayscale FashionMNIST / digits images are repeated to 3 channels for timm backbones
    (:func:`bayesurl.data.default_transform`).
    """
    if isinstance(backbone, str):
        return 1 if backbone.lower() == "small_convnet" else 3
    conv = next((m for m in backbone.modules() if isinstance(m, nn.Conv2d)), None)
    return int(conv.in_channels) if conv is not None else 1


def _resolve_device(device: str | torch.device | None) -> torch.device:
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        return torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"`device` {device!r} is not a torch device: {exc}") from None


@torch.no_grad()
def embed(
    method: nn.Module,
    x: Tensor,
    *,
    n_samples: int = 0,
    batch_size: int = 500,
    device: str | torch.device | None = None,
) -> Output:
    """Run a trained method over a whole input tensor in eval mode, in batches.

    Parameters
    ----------
    method : Method
        Any module following the :class:`~bayesurl.methods.Method` contract
        (``forward(x, n_samples) -> Output``).
    x : Tensor
        ``[N, ...]`` transformed inputs.
    n_samples : int
        Draws ``S`` from the method's embedding distribution (``samples [S, N, D]``); 0 for
        none.
    batch_size : int
        Inputs per forward pass.
    device : str or torch.device, optional
        Where to run; default: the device of the method's parameters. Batches of ``x`` are
        moved there and the returned :class:`~bayesurl.Output` lives there.

    Returns
    -------
    Output
        Concatenated over the batches, detached.

    Raises
    ------
    ValueError
        If ``x`` is empty or ``batch_size`` / ``n_samples`` are invalid.
    """
    if not isinstance(x, Tensor) or x.ndim < 2 or x.shape[0] < 1:
        raise ValueError(f"`x` must be a non-empty batch tensor [N, ...], got {type(x).__name__}")
    if int(batch_size) < 1:
        raise ValueError(f"`batch_size` must be >= 1, got {batch_size}")
    if int(n_samples) < 0:
        raise ValueError(f"`n_samples` must be >= 0, got {n_samples}")
    if device is None:
        p = next(method.parameters(), None)
        device = p.device if p is not None else x.device
    was_training = method.training
    method.eval()
    try:
        outs = [
            method(x[i : i + batch_size].to(device), n_samples=int(n_samples)).detach()
            for i in range(0, x.shape[0], int(batch_size))
        ]
    finally:
        method.train(was_training)
    return Output.cat(outs)


def evaluate_method(
    method: nn.Module,
    data: Any,
    *,
    n_samples: int | None = None,
    transform: Any | None = None,
    batch_size: int = 500,
    device: str | torch.device | None = None,
    seed: int = 0,
    return_curves: bool = False,
    **evaluate_kwargs: Any,
) -> dict[str, Any]:
    """Zero-shot evaluation of a trained method on a :class:`~bayesurl.data.ZeroShotData`.

    Embeds the downstream ``test`` set (every image is a query, URL section 3.2) and computes
    R@1, R-AUROC, AUSC / AUSE, mAP@5 and -- with samples -- the retrieval ECE with
    :func:`bayesurl.evaluation.evaluate` (METRICS.md). The OOD AUROC / AUPRC compare u on
    ``data.ood`` (positive class) with u on the held-out upstream ``data.id_test`` (DATA.md).

    Parameters
    ----------
    method : Method
        The trained method.
    data : ZeroShotData
        Evaluation sets (``test`` required; ``id_test`` and ``ood`` optional).
    n_samples : int, optional
        Draws ``S`` for the ECE. ``None``: 10 if the method has a distribution
        (``has_distribution``), else 0. A method without a distribution always gets 0, so its
        ECE is ``None``.
    transform : callable, optional
        Batch transform of the stored ``uint8`` images; default
        :func:`bayesurl.data.default_transform` with the channels of the method's backbone.
    batch_size : int
        Images per forward pass.
    device : str or torch.device, optional
        Where to run (default: the method's device).
    seed : int
        Seeds torch before drawing samples so the ECE is reproducible.
    return_curves : bool
        Also return the sparsification and reliability curves.
    **evaluate_kwargs
        Passed to :func:`bayesurl.evaluation.evaluate` (``ks``, ``ece_mode``, ``shortlist``...).
        ``distributed`` (default: True under a process group of more than one rank, e.g.
        ``torchrun``): each rank embeds its contiguous rows of every set and the evaluation is
        sharded (issue 16); the retrieval metrics equal one process's, the ECE draws are
        seeded per rank (``seed + rank``), so they differ from one process's draws.

    Returns
    -------
    dict
        The evaluator's result (``r@1``, ``r_auroc``, ``ausc``, ``ause``, ``ece``, ``map@5``,
        ``notes``, ...) with ``ood_auroc`` / ``ood_auprc`` from ``id_test`` vs ``ood``,
        ``n_samples``, ``n_test``, ``n_id_test``, ``n_ood`` and ``eval_time`` (seconds).
    """
    from bayesurl.data import as_tensors, default_transform
    from bayesurl.evaluation import evaluate
    from bayesurl.evaluation import functional as Fm

    t0 = time.perf_counter()
    has_dist = bool(getattr(method, "has_distribution", False))
    if n_samples is None:
        n_samples = 10 if has_dist else 0
    if int(n_samples) < 0:
        raise ValueError(f"`n_samples` must be >= 0, got {n_samples}")
    n_samples = int(n_samples) if has_dist else 0
    if transform is None:
        backbone = getattr(method, "hparams", {}).get("backbone", "small_convnet")
        transform = default_transform(input_channels(backbone))
    if getattr(data, "test", None) is None:
        raise ValueError("`data` has no `test` set")
    x, y = as_tensors(data.test, transform)
    n_test = int(x.shape[0])
    from bayesurl.distributed import get_rank, is_distributed, shard_range

    distributed = evaluate_kwargs.pop("distributed", None)
    distributed = is_distributed() if distributed is None else bool(distributed)
    evaluate_kwargs["distributed"] = distributed
    if distributed:  # this rank's contiguous rows, seeded per rank (issue 16)
        lo, hi = shard_range(n_test)
        x, y = x[lo:hi], y[lo:hi]
        seed = seed + get_rank()
    run_dev = torch.device(device) if device is not None else None
    if run_dev is None:
        p = next(method.parameters(), None)
        run_dev = p.device if p is not None else torch.device("cpu")
    # draws are reproducible (``seed``) without touching the caller's random state
    cuda = [run_dev] if run_dev.type == "cuda" else []
    with torch.random.fork_rng(devices=cuda):
        torch.manual_seed(seed)
        out = embed(method, x, n_samples=n_samples, batch_size=batch_size, device=run_dev)
    res = evaluate(
        out.embedding,
        y.to(out.embedding.device),
        uncertainties=out.uncertainty,
        samples=out.samples if n_samples > 0 else None,
        return_curves=return_curves,
        **evaluate_kwargs,
    )
    res["n_samples"] = n_samples
    res["n_test"] = n_test
    id_set, ood_set = getattr(data, "id_test", None), getattr(data, "ood", None)
    res["n_id_test"] = None if id_set is None else len(id_set)
    res["n_ood"] = None if ood_set is None else len(ood_set)
    if id_set is not None and ood_set is not None:

        def _u(dataset: Any) -> Tensor | None:
            xs = as_tensors(dataset, transform)[0]
            if not distributed:
                return embed(method, xs, batch_size=batch_size, device=device).uncertainty
            from bayesurl.distributed import all_gather_tensors

            lo, hi = shard_range(int(xs.shape[0]))
            u = embed(method, xs[lo:hi], batch_size=batch_size, device=device).uncertainty
            return None if u is None else all_gather_tensors(u)

        u_id, u_ood = _u(id_set), _u(ood_set)
        res["ood_auroc"] = float(Fm.ood_auroc(u_id, u_ood))
        res["ood_auprc"] = float(Fm.ood_auprc(u_id, u_ood))
        res["notes"] = [n for n in res["notes"] if not n.startswith("ood_auroc")]
        res["notes"].append("ood_auroc, ood_auprc: u(ood) vs u(id_test), OOD = positive class")
    else:
        res["notes"].append("ood_auroc, ood_auprc: `data` lacks `id_test` or `ood`")
    res["eval_time"] = time.perf_counter() - t0
    return res


#: Data sets ``evaluate_checkpoint`` can build (those of ``bayesurl train``).
CHECKPOINT_DATASETS = ("default", "fashion_mnist", "digits")


def evaluate_checkpoint(
    path: str | os.PathLike[str],
    *,
    dataset: str | None = None,
    root: str | os.PathLike[str] | None = None,
    n_samples: int | None = None,
    max_test: int | None = None,
    max_ood: int | None = None,
    device: str | torch.device | None = "cpu",
    batch_size: int = 500,
    seed: int = 0,
    return_curves: bool = False,
    **evaluate_kwargs: Any,
) -> dict[str, Any]:
    """Evaluate a trained method checkpoint zero-shot (URL section 3.2).

    Rebuilds the method with :func:`bayesurl.training.load_method_from_checkpoint` (weights-only
    load), builds the zero-shot sets of its data set and runs :func:`evaluate_method`.

    Parameters
    ----------
    path : path-like
        ``last.pt`` written by ``bayesurl train`` / :func:`bayesurl.training.fit`.
    dataset : {"default", "fashion_mnist", "digits"}, optional
        The data set the method was trained on; default: the ``dataset`` recorded in
        ``train.json`` next to the checkpoint, else ``"default"`` (FashionMNIST, digits if
        absent).
    root : path-like, optional
        FashionMNIST location.
    n_samples : int, optional
        Draws for the ECE (default 10 for methods with a distribution, 0 otherwise).
    max_test, max_ood : int, optional
        Caps on the downstream test / held-out upstream sets and on the OOD set.
    device : str or torch.device, optional
        Where to evaluate (CPU by default; ``None``: CUDA if available).
    batch_size : int
        Images per forward pass.
    seed : int
        Seed of the ECE draws.
    return_curves : bool
        Also return the sparsification and reliability curves.
    **evaluate_kwargs
        Passed to :func:`bayesurl.evaluation.evaluate`.

    Returns
    -------
    dict
        :func:`evaluate_method`'s result plus ``method``, ``checkpoint``, ``dataset``.

    Raises
    ------
    FileNotFoundError
        If ``path`` does not exist.
    ValueError
        If the checkpoint is corrupted or not a bayesurl method checkpoint (the message names
        ``path``), or ``dataset`` is unknown.
    """
    from bayesurl.data import default_zero_shot, find_fashion_mnist
    from bayesurl.training import load_method_from_checkpoint

    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"checkpoint {str(p)!r} does not exist")
    if dataset is None:
        dataset = "default"
        info = p.parent / "train.json"
        if info.is_file():
            try:
                dataset = str(json.loads(info.read_text()).get("dataset") or "default")
            except (json.JSONDecodeError, AttributeError, UnicodeDecodeError):
                dataset = "default"
    name = str(dataset).lower().replace("-", "_")
    if name not in CHECKPOINT_DATASETS:
        raise ValueError(
            f"unknown `dataset` {dataset!r}; valid names: {', '.join(CHECKPOINT_DATASETS)}"
        )
    dev = _resolve_device(device)
    method = load_method_from_checkpoint(p, map_location=dev)
    if name == "fashion_mnist" and root is None:
        root = find_fashion_mnist()
    for arg, value in (("max_test", max_test), ("max_ood", max_ood)):
        if value is not None and int(value) < 1:
            raise ValueError(f"`{arg}` must be a positive size or None, got {value}")
    data = default_zero_shot(
        root,
        force_digits=name == "digits",
        max_test=max_test,
        max_ood=max_ood,
        val_fraction=0.0,
        seed=0,
    )
    res = evaluate_method(
        method,
        data,
        n_samples=n_samples,
        batch_size=batch_size,
        device=dev,
        seed=seed,
        return_curves=return_curves,
        **evaluate_kwargs,
    )
    res = {"method": method.name, "checkpoint": str(p), "dataset": data.name, **res}
    return res


def _mean_std(values: Sequence[float | None]) -> dict[str, Any]:
    vals = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    if not vals:
        return {"mean": None, "std": None, "n": 0}
    mean = sum(vals) / len(vals)
    std = math.sqrt(sum((v - mean) ** 2 for v in vals) / (len(vals) - 1)) if len(vals) > 1 else None
    return {"mean": mean, "std": std, "n": len(vals)}


def _fmt(stat: Mapping[str, Any], key: str) -> str:
    if stat.get("mean") is None:
        return "n/a"
    digits = 1 if key.endswith("_time") else 3
    s = f"{stat['mean']:.{digits}f}"
    if stat.get("std") is not None:
        s += f" +- {stat['std']:.{digits}f}"
    return s


@dataclass
class BenchmarkResults:
    """Everything :func:`run_benchmark` measured.

    Attributes
    ----------
    runs : list of dict
        One record per (method, seed): ``method``, ``seed``, every metric of
        :func:`evaluate_method`, ``train_time`` (wall seconds), ``train_cpu_time`` (process CPU
        seconds, all threads), ``final_loss``, ``steps``, ``error`` (``None``
        or the exception text of a failed run; its metrics are then ``None``).
    settings : dict
        Preset, recipes, data sizes, device, versions, total wall time.
    """

    runs: list[dict[str, Any]]
    settings: dict[str, Any]

    @property
    def methods(self) -> list[str]:
        """Method names in run order."""
        return list(dict.fromkeys(r["method"] for r in self.runs))

    def summary(self) -> dict[str, dict[str, dict[str, Any]]]:
        """``{method: {metric: {"mean", "std", "n"}}}`` over the seeds (std with ddof 1).

        A metric that is ``None`` in every run (the ECE of a method without a distribution)
        has ``mean = std = None`` and ``n = 0``; std is ``None`` with a single seed.
        """
        out: dict[str, dict[str, dict[str, Any]]] = {}
        keys = [k for k, _ in METRICS] + list(EXTRA_METRICS)
        for m in self.methods:
            runs = [r for r in self.runs if r["method"] == m]
            out[m] = {k: _mean_std([r.get(k) for r in runs]) for k in keys}
            out[m]["failed"] = {"mean": None, "std": None, "n": sum(bool(r["error"]) for r in runs)}
        return out

    def table(self) -> str:
        """The benchmark table: one row per method, mean +- std over seeds."""
        summ = self.summary()
        head = ["method", *(title for _, title in METRICS)]
        rows = []
        for m in self.methods:
            row = [m] + [_fmt(summ[m][k], k) for k, _ in METRICS]
            if summ[m]["failed"]["n"]:
                row[0] += f" ({summ[m]['failed']['n']} failed)"
            rows.append(row)
        widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
        fmt = lambda r: "  ".join(  # noqa: E731
            c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))
        )
        s = self.settings
        seeds = ",".join(str(x) for x in s.get("seeds", []))
        lines = [
            f"bayesurl benchmark: preset {s.get('preset')}, data {s.get('dataset')}, "
            f"seeds {seeds}, device {s.get('device')}",
            fmt(head),
            fmt(["-" * w for w in widths]),
            *(fmt(r) for r in rows),
            "ECE n/a: the method has only a scalar u (no distribution to sample, METRICS.md).",
        ]
        errors = [r for r in self.runs if r["error"]]
        lines += [f"FAILED {r['method']} seed {r['seed']}: {r['error']}" for r in errors]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready ``{"settings", "summary", "runs"}``."""
        return {"settings": self.settings, "summary": self.summary(), "runs": self.runs}

    def write_json(self, path: str | os.PathLike[str]) -> Path:
        """Write :meth:`to_dict` as JSON (``null`` where a metric is undefined)."""
        p = Path(path)
        p.write_text(json.dumps(self.to_dict(), indent=2, default=str))
        return p

    def write_csv(self, path: str | os.PathLike[str]) -> Path:
        """One row per method: ``n_seeds``, ``failed`` and ``<metric>_mean`` / ``_std``."""
        p = Path(path)
        summ = self.summary()
        keys = [k for k, _ in METRICS] + list(EXTRA_METRICS)
        cols = ["method", "n_seeds", "failed"] + [f"{k}_{s}" for k in keys for s in ("mean", "std")]
        with p.open("w", newline="") as f:
            w = csv.writer(f)
            w.writerow(cols)
            for m in self.methods:
                n = sum(r["method"] == m for r in self.runs)
                row: list[Any] = [m, n, summ[m]["failed"]["n"]]
                for k in keys:
                    for s in ("mean", "std"):
                        v = summ[m][k][s]
                        row.append("" if v is None else f"{v:.10g}")
                w.writerow(row)
        return p

    def plot(self, path: str | os.PathLike[str] | None = None) -> Any:
        """R@1 against R-AUROC, one point per method with +- std bars (URL Fig. 2).

        Uses :func:`bayesurl.evaluation.plots.plot_recall_vs_rauroc` on a figure that needs no GUI
        backend; the dashed line marks R-AUROC = 0.5 (u carries no information).

        Returns
        -------
        matplotlib.figure.Figure
        """
        from matplotlib.figure import Figure

        from bayesurl.evaluation import plot_recall_vs_rauroc

        summ = self.summary()
        fig = Figure(figsize=(5.5, 4.2))
        ax = fig.add_subplot(1, 1, 1)
        means = {
            m: {"r@1": summ[m]["r@1"]["mean"], "r_auroc": summ[m]["r_auroc"]["mean"]}
            for m in self.methods
        }
        plot_recall_vs_rauroc(means, ax=ax)
        for m in self.methods:
            r1, ra = summ[m]["r@1"], summ[m]["r_auroc"]
            if r1["mean"] is None or ra["mean"] is None:
                continue
            if r1["std"] is not None or ra["std"] is not None:
                ax.errorbar(
                    r1["mean"],
                    ra["mean"],
                    xerr=r1["std"] or 0.0,
                    yerr=ra["std"] or 0.0,
                    fmt="none",
                    ecolor="0.6",
                    lw=0.8,
                )
        ax.axhline(0.5, ls="--", lw=0.8, color="0.5")
        s = self.settings
        ax.set_title(
            f"{s.get('dataset')} zero-shot, preset {s.get('preset')}, "
            f"{len(s.get('seeds', []))} seed(s)",
            fontsize=9,
        )
        fig.tight_layout()
        if path is not None:
            fig.savefig(path, dpi=130)
        return fig

    def save(self, out: str | os.PathLike[str]) -> dict[str, Path]:
        """Write ``results.json``, ``results.csv`` and ``recall_vs_rauroc.png`` into ``out``."""
        d = Path(out)
        d.mkdir(parents=True, exist_ok=True)
        paths = {
            "json": self.write_json(d / "results.json"),
            "csv": self.write_csv(d / "results.csv"),
            "png": d / "recall_vs_rauroc.png",
        }
        self.plot(paths["png"])
        return paths


def merge_results(
    sources: Iterable[str | os.PathLike[str] | BenchmarkResults],
) -> BenchmarkResults:
    """Combine benchmark runs made separately (e.g. one seed per machine) into one result.

    Parameters
    ----------
    sources : iterable
        :class:`BenchmarkResults`, ``results.json`` files, or folders holding one.

    Returns
    -------
    BenchmarkResults
        All runs (method order of first appearance, then by seed); the settings of the first
        source with ``seeds`` / ``methods`` updated and the sources' ``total_time`` summed.

    Raises
    ------
    FileNotFoundError
        If a path holds no ``results.json``.
    ValueError
        If a file is not a benchmark result, the presets or data differ, or a (method, seed)
        pair appears twice.
    """
    parts: list[BenchmarkResults] = []
    for src in sources:
        if isinstance(src, BenchmarkResults):
            parts.append(src)
            continue
        path = Path(src)
        if path.is_dir():
            path = path / "results.json"
        if not path.is_file():
            raise FileNotFoundError(f"benchmark result {str(path)!r} does not exist")
        try:
            data = json.loads(path.read_text())
            parts.append(BenchmarkResults(runs=list(data["runs"]), settings=dict(data["settings"])))
        except (json.JSONDecodeError, KeyError, TypeError, UnicodeDecodeError) as exc:
            raise ValueError(f"{str(path)!r} is not a bayesurl benchmark result: {exc}") from None
    if not parts:
        raise ValueError("`sources` is empty")
    first = parts[0].settings
    for p in parts[1:]:
        for key in ("preset_settings", "dataset", "sizes"):
            if p.settings.get(key) != first.get(key):
                raise ValueError(f"cannot merge benchmark results with different `{key}`")
    runs = [r for p in parts for r in p.runs]
    seen: set[tuple[str, int]] = set()
    for r in runs:
        key = (r["method"], int(r["seed"]))
        if key in seen:
            raise ValueError(f"method {key[0]!r} seed {key[1]} appears in more than one source")
        seen.add(key)
    order = list(dict.fromkeys(r["method"] for r in runs))
    runs.sort(key=lambda r: (order.index(r["method"]), int(r["seed"])))
    settings = dict(first)
    settings["seeds"] = sorted({int(r["seed"]) for r in runs})
    settings["methods"] = order
    settings["total_time"] = sum(float(p.settings.get("total_time") or 0.0) for p in parts)
    settings["merged_from"] = len(parts)
    return BenchmarkResults(runs=runs, settings=settings)


class _Keep(nn.Module):
    """Per-item transform that keeps the stored ``uint8`` image; batches are transformed in
    :func:`bayesurl.training.fit` (``augment``), which is much faster than item by item."""

    def forward(self, x: Tensor) -> Tensor:
        return x


def _load_data(preset: Preset, root: str | os.PathLike[str] | None) -> Any:
    from bayesurl.data import default_zero_shot

    return default_zero_shot(
        root,
        max_train=preset.max_train,
        max_test=preset.max_test,
        max_ood=preset.max_ood,
        val_fraction=0.0,
        seed=0,
    )


def _train_and_evaluate(
    name: str,
    seed: int,
    data: Any,
    preset: Preset,
    device: torch.device,
    checkpoint_dir: Path | None,
) -> dict[str, Any]:
    from bayesurl.data import default_augmentation, default_transform, make_loader
    from bayesurl.methods import get
    from bayesurl.training import fit, seed_everything

    cls = get(name)
    recipe = recipe_for(name)
    channels = input_channels(preset.backbone)
    kwargs: dict[str, Any] = {
        "backbone": preset.backbone,
        "embed_dim": preset.embed_dim,
        "num_classes": int(data.num_train_classes),
        "backbone_kwargs": dict(preset.backbone_kwargs),
        **dict(recipe.kwargs),
    }
    seed_everything(seed)
    method = cls(**kwargs)
    record = getattr(method, "hparams", None)
    method_kwargs = {**dict(record), **kwargs} if isinstance(record, Mapping) else kwargs
    augment = default_augmentation(channels) if cls.two_view else default_transform(channels)
    loader = make_loader(
        data.train.with_transform(_Keep()),
        preset.batch_size,
        shuffle=True,
        seed=seed,
        drop_last=cls.two_view,
    )
    epochs = max(1, round(preset.epochs * recipe.epochs_mult))
    cpu0 = time.process_time()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*cannot rebuild the method.*")
        result = fit(
            method,
            loader,
            epochs=epochs,
            optimizer=preset.optimizer,
            lr=recipe.lr,
            weight_decay=recipe.weight_decay,
            warmup_epochs=preset.warmup_epochs,
            seed=seed,
            augment=augment.to(device),
            device=device,
            progress=False,
            checkpoint_dir=None if checkpoint_dir is None else checkpoint_dir / f"{name}_s{seed}",
            method_kwargs=method_kwargs if checkpoint_dir is not None else None,
        )
    cpu_train = time.process_time() - cpu0
    n_samples = recipe.eval_samples if recipe.eval_samples is not None else preset.eval_samples
    res = evaluate_method(
        method,
        data,
        n_samples=n_samples if cls.has_distribution else 0,
        transform=default_transform(channels),
        batch_size=preset.eval_batch_size,
        device=device,
        seed=seed,
    )
    res.update(
        train_time=float(result.train_time),
        train_cpu_time=float(cpu_train),
        final_loss=float(result.final_loss),
        steps=int(result.global_step),
        epochs=int(result.epochs),
    )
    return res


def run_benchmark(
    methods: str | Iterable[str] | None = None,
    seeds: int | Iterable[int] = (0,),
    preset: str | Preset = "quick",
    device: str | torch.device | None = None,
    out: str | os.PathLike[str] | None = None,
    progress: bool = True,
    root: str | os.PathLike[str] | None = None,
    *,
    raise_errors: bool = False,
    checkpoint_dir: str | os.PathLike[str] | None = None,
) -> BenchmarkResults:
    """Train and evaluate every method on the embedded zero-shot default (URL benchmark).

    For each method and seed: seed everything (:func:`bayesurl.training.seed_everything`),
    build the method with its :class:`Recipe` (two-view methods get two draws of
    :func:`bayesurl.data.default_augmentation`, the others the deterministic transform and
    labels), train it on the upstream classes with :func:`bayesurl.training.fit`, and evaluate
    it zero-shot with :func:`evaluate_method` (R@1, R-AUROC, AUSC, ECE where a distribution is
    defined, OOD AUROC; URL section 3, LAM section 5). The metrics are aggregated over seeds
    (mean, std).

    Parameters
    ----------
    methods : str, iterable of str or None
        Registry names (``None``: every registered method, :func:`bayesurl.methods.available`).
    seeds : int or iterable of int
        Training seeds; an int ``n`` means ``range(n)``.
    preset : {"quick", "full", "smoke"} or Preset
        Data sizes and training length (:data:`PRESETS`).
    device : str or torch.device, optional
        Training / evaluation device; default CUDA if available, else CPU.
    out : path-like, optional
        Folder for ``results.json``, ``results.csv`` and ``recall_vs_rauroc.png``.
    progress : bool
        Show a tqdm bar over the (method, seed) runs and one line per finished run.
    root : path-like, optional
        FashionMNIST location (default: the system path; digits if absent there).
    raise_errors : bool
        Re-raise the exception of a failing run instead of recording it in ``error`` and going
        on with the other methods.
    checkpoint_dir : path-like, optional
        Keep each run's training checkpoint in ``checkpoint_dir/<method>_s<seed>/last.pt``
        (loadable by ``bayesurl evaluate --checkpoint``).

    Returns
    -------
    BenchmarkResults
        ``.table()`` prints the table; ``.summary()`` gives the aggregates.

    Raises
    ------
    ValueError
        On an unknown method or preset name, an empty seed list or a negative seed.
    FileNotFoundError
        If an explicit ``root`` holds no FashionMNIST.
    """
    from tqdm.auto import tqdm

    names = resolve_methods(methods)
    p = get_preset(preset)
    if isinstance(seeds, bool):
        raise ValueError(f"`seeds` must be an int or a list of ints, got {seeds!r}")
    seed_list = list(range(int(seeds))) if isinstance(seeds, int) else [int(s) for s in seeds]
    if not seed_list or min(seed_list) < 0:
        raise ValueError(f"`seeds` must hold non-negative integers, got {seed_list}")
    dev = _resolve_device(device)
    ckpt = None if checkpoint_dir is None else Path(checkpoint_dir)

    t0 = time.perf_counter()
    data = _load_data(p, root)
    runs: list[dict[str, Any]] = []
    jobs = [(m, s) for m in names for s in seed_list]
    bar = tqdm(jobs, disable=not progress, desc="benchmark", unit="run")
    for name, seed in bar:
        bar.set_description(f"{name} seed {seed}")
        record: dict[str, Any] = {"method": name, "seed": seed, "error": None}
        try:
            record.update(_train_and_evaluate(name, seed, data, p, dev, ckpt))
        except Exception as exc:
            if raise_errors:
                raise
            record["error"] = f"{type(exc).__name__}: {exc}"
            record["traceback"] = traceback.format_exc(limit=3)
            for k, _ in METRICS:
                record.setdefault(k, None)
        runs.append(record)
        if progress:
            if record["error"]:
                bar.write(f"{name} seed {seed}: FAILED {record['error']}")
            else:
                bar.write(
                    f"{name} seed {seed}: "
                    + ", ".join(
                        f"{title} {_fmt({'mean': record.get(k)}, k)}" for k, title in METRICS
                    )
                )
    bar.close()
    settings = {
        "preset": p.name,
        "preset_settings": asdict(p),
        "recipes": {n: asdict(recipe_for(n)) for n in names},
        "methods": names,
        "seeds": seed_list,
        "data_seed": 0,
        "device": str(dev),
        "dataset": data.name,
        "ood": data.ood_name,
        "upstream_classes": list(data.upstream_classes),
        "downstream_classes": list(data.downstream_classes),
        "sizes": {
            k: (None if getattr(data, k) is None else len(getattr(data, k)))
            for k in ("train", "test", "id_test", "ood")
        },
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "total_time": time.perf_counter() - t0,
    }
    results = BenchmarkResults(runs=runs, settings=settings)
    if out is not None:
        results.save(out)
    return results
