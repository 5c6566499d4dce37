"""The benchmark's class-split protocol: several seeded class splits, a class-disjoint
validation split, and every downstream image as the retrieval set.

URL (Kirchhof et al., 2023, section 3) averages every model over three downstream data sets and
three seeds, and tunes each model on a class-disjoint validation split. On the embedded
10-class data the analogue of "several downstream data sets" is several **class splits**:

* :func:`class_splits` draws ``n_splits`` splits of the classes into ``n_upstream`` upstream
  (trained on) and the rest downstream (never trained on). Splits come in **complementary
  pairs** (split ``2j + 1`` swaps the roles of split ``2j``), so over an even number of splits
  every class is downstream equally often and class difficulty does not tilt the average; split
  0 is the default ``0-4 -> 5-9`` of :func:`bayesurl.data.default_zero_shot`, later pairs are
  seeded permutations, all distinct. Each split also names ``n_val`` of its upstream classes as
  the **validation classes** (URL section 3.2, "we further divide the classes in the train set
  equally into a train and a validation split").
* :func:`split_data` assembles the sets of one split for one stage:

  - ``stage="final"``: ``train`` = the training images of all upstream classes; ``test`` (the
    retrieval set of R@1 / R-AUROC / AUSC / ECE) = **all** images of the downstream classes,
    train and test files together (they are never trained on: 35,000 Fashion-MNIST images for
    5 classes instead of 5,000); ``id_test`` = the held-out test-file images of the upstream
    classes (5,000) against ``ood`` (the 1,797 digits) for OOD AUROC.
  - ``stage="tune"``: ``train`` = the training images of the upstream classes minus the
    validation classes; ``test`` = all images of the validation classes (class-disjoint
    validation, the tuning objective's retrieval set); ``id_test`` = held-out images of the
    classes trained on.

Sizes can be capped (class-balanced, seeded) for quick runs.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from .base import ImageTensorDataset, subset
from .fmnist import fashion_mnist, find_fashion_mnist
from .sklearn_digits import load_digits_images
from .splits import stratified_split, stratified_subsample
from .zero_shot import ZeroShotData, synthetic_ood

__all__ = ["ClassSplit", "class_splits", "split_data"]


@dataclass(frozen=True)
class ClassSplit:
    """One class split of the benchmark protocol.

    Attributes
    ----------
    index : int
        Position in the list of splits.
    upstream : tuple of int
        Classes trained on in the final runs (sorted).
    downstream : tuple of int
        Classes never trained on: the retrieval set of the final runs (sorted).
    val : tuple of int
        Upstream classes held out while tuning (class-disjoint validation; sorted).
    """

    index: int
    upstream: tuple[int, ...]
    downstream: tuple[int, ...]
    val: tuple[int, ...]

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (lists)."""
        return {
            "index": self.index,
            "upstream": list(self.upstream),
            "downstream": list(self.downstream),
            "val": list(self.val),
        }


def class_splits(
    n_splits: int,
    *,
    num_classes: int = 10,
    n_upstream: int | None = None,
    n_val: int = 2,
    seed: int = 0,
) -> list[ClassSplit]:
    """Seeded, distinct class splits in complementary pairs (see module docs).

    Parameters
    ----------
    n_splits : int
        Number of splits (>= 1).
    num_classes : int
        Classes ``0..num_classes-1``.
    n_upstream : int, optional
        Upstream classes per split; default ``num_classes // 2`` (complementary pairs need
        exactly half; with another count splits are independent permutations).
    n_val : int
        Validation classes taken from the upstream ones (>= 1, < ``n_upstream``).
    seed : int
        Seed of the permutations (a private generator).

    Returns
    -------
    list of ClassSplit

    Raises
    ------
    ValueError
        On counts out of range, or when ``n_splits`` distinct splits do not exist.
    """
    k = int(num_classes)
    n_up = k // 2 if n_upstream is None else int(n_upstream)
    if int(n_splits) < 1:
        raise ValueError(f"`n_splits` must be positive, got {n_splits}")
    if k < 2 or not 1 <= n_up < k:
        raise ValueError(f"`n_upstream` must be in [1, {k - 1}], got {n_upstream}")
    if not 1 <= int(n_val) < n_up:
        raise ValueError(f"`n_val` must be in [1, {n_up - 1}] (upstream {n_up}), got {n_val}")
    if int(n_splits) > math.comb(k, n_up):
        raise ValueError(
            f"cannot draw {n_splits} distinct splits: only {math.comb(k, n_up)} ways to choose "
            f"{n_up} of {k} classes"
        )
    paired = 2 * n_up == k
    gen = torch.Generator().manual_seed(int(seed))
    ups: list[tuple[int, ...]] = []
    seen: set[tuple[int, ...]] = set()
    tries = 0
    while len(ups) < int(n_splits):
        if not ups:
            up = tuple(range(n_up))
        else:
            up = tuple(sorted(torch.randperm(k, generator=gen)[:n_up].tolist()))
        comp = tuple(c for c in range(k) if c not in up)
        tries += 1
        if tries > 10_000:
            raise ValueError(f"cannot draw {n_splits} distinct splits of {k} classes")
        if up in seen or (paired and comp in seen):
            continue
        ups.append(up)
        seen.add(up)
        if paired and len(ups) < int(n_splits):
            ups.append(comp)
            seen.add(comp)
    out = []
    for i, up in enumerate(ups):
        down = tuple(c for c in range(k) if c not in up)
        perm = torch.randperm(len(up), generator=gen)[: int(n_val)].tolist()
        val = tuple(sorted(up[j] for j in perm))
        out.append(ClassSplit(index=i, upstream=up, downstream=down, val=val))
    return out


def _pool(
    dataset: str, root: str | os.PathLike[str] | None, seed: int
) -> tuple[ImageTensorDataset, torch.Tensor, ImageTensorDataset, str]:
    """All images of the data set, a ``held`` flag (official test file / held-out 20 %), the
    OOD set and its name."""
    if dataset == "fashion_mnist":
        find_fashion_mnist(root)
        tr, te = fashion_mnist(root, "train"), fashion_mnist(root, "test")
        images = torch.cat([tr.images, te.images])
        labels = torch.cat([tr.targets, te.targets])
        held = torch.cat(
            [torch.zeros(len(tr), dtype=torch.bool), torch.ones(len(te), dtype=torch.bool)]
        )
        d_img, d_lbl = load_digits_images(int(images.shape[-1]))
        ood = ImageTensorDataset(d_img, d_lbl, name="digits/ood")
        return ImageTensorDataset(images, labels, name="fashion_mnist"), held, ood, "digits"
    images, labels = load_digits_images(28)
    _, held_idx = stratified_split(labels, 0.2, seed=seed)
    held = torch.zeros(len(labels), dtype=torch.bool)
    held[held_idx] = True
    ood = synthetic_ood(len(labels), 28, seed=seed)
    ood.name = "noise/ood"
    return ImageTensorDataset(images, labels, name="digits"), held, ood, "noise"


def _cap(ds: Any, n: int | None, seed: int) -> Any:
    if n is None or n >= len(ds):
        return ds
    return subset(ds, stratified_subsample(ds, n, seed=seed))


def split_data(
    split: ClassSplit,
    *,
    stage: str = "final",
    root: str | os.PathLike[str] | None = None,
    dataset: str = "fashion_mnist",
    max_train: int | None = None,
    max_test: int | None = None,
    max_id: int | None = None,
    max_ood: int | None = None,
    transform: Callable[[Any], Any] | None = None,
    seed: int = 0,
) -> ZeroShotData:
    """The sets of one class split for the final runs or for tuning (see module docs).

    Parameters
    ----------
    split : ClassSplit
        From :func:`class_splits`.
    stage : {"final", "tune"}
        Final runs (train on all upstream classes, retrieve among the downstream ones) or
        tuning (train without the validation classes, retrieve among them).
    root : path-like, optional
        Fashion-MNIST location (default system path).
    dataset : {"fashion_mnist", "digits"}
        The embedded data set (digits: 1,797 images, OOD = seeded noise images).
    max_train, max_test, max_id, max_ood : int, optional
        Class-balanced caps on ``train``, ``test`` (retrieval), ``id_test`` and ``ood``.
    transform : callable, optional
        Per-item transform of every set.
    seed : int
        Seed of the caps and of the digits' held-out split.

    Returns
    -------
    ZeroShotData
        ``train`` relabelled to ``0..K-1`` in the order of the trained classes; ``test`` and
        ``ood`` with original labels; ``id_test`` relabelled like ``train``.
        ``info["split"]`` holds the split, ``info["stage"]`` the stage.

    Raises
    ------
    ValueError
        On an unknown ``stage`` / ``dataset``, a class outside the data, or a cap < 1.
    FileNotFoundError
        If Fashion-MNIST is requested and missing.
    """
    if stage not in ("final", "tune"):
        raise ValueError(f"`stage` must be 'final' or 'tune', got {stage!r}")
    if dataset not in ("fashion_mnist", "digits"):
        raise ValueError(f"`dataset` must be 'fashion_mnist' or 'digits', got {dataset!r}")
    for arg, v in (("max_train", max_train), ("max_test", max_test), ("max_id", max_id)):
        if v is not None and int(v) < 1:
            raise ValueError(f"`{arg}` must be a positive size or None, got {v}")
    if max_ood is not None and int(max_ood) < 1:
        raise ValueError(f"`max_ood` must be a positive size or None, got {max_ood}")
    pool, held, ood, ood_name = _pool(dataset, root, seed)
    present = set(pool.targets.unique().tolist())
    bad = sorted({*split.upstream, *split.downstream} - present)
    if bad:
        raise ValueError(f"`split` names classes {bad} that {dataset} does not have")
    if stage == "final":
        fit_cls = list(split.upstream)
        eval_cls = list(split.downstream)
    else:
        fit_cls = [c for c in split.upstream if c not in split.val]
        eval_cls = list(split.val)
    y = pool.targets
    fit_mask = torch.isin(y, torch.tensor(fit_cls))
    relabel = {c: i for i, c in enumerate(fit_cls)}
    train = _cap(
        subset(pool, (fit_mask & ~held).nonzero().flatten(), relabel=relabel), max_train, seed
    )
    id_test = _cap(
        subset(pool, (fit_mask & held).nonzero().flatten(), relabel=relabel), max_id, seed
    )
    test = _cap(
        subset(pool, torch.isin(y, torch.tensor(eval_cls)).nonzero().flatten()), max_test, seed
    )
    ood = _cap(ood, max_ood, seed)
    sets = {"train": train, "test": test, "id_test": id_test, "ood": ood}
    for key, ds in sets.items():
        ds.name = f"{pool.name}/split{split.index}/{stage}/{key}" if key != "ood" else ood.name
        sets[key] = ds.with_transform(transform)
    empty = subset(pool, torch.empty(0, dtype=torch.int64)).with_transform(transform)
    return ZeroShotData(
        name=dataset,
        train=sets["train"],
        val=empty,
        test=sets["test"],
        id_test=sets["id_test"],
        ood=sets["ood"],
        ood_name=ood_name,
        upstream_classes=fit_cls,
        downstream_classes=eval_cls,
        num_train_classes=len(fit_cls),
        image_shape=tuple(pool.images.shape[1:]),  # type: ignore[arg-type]
        info={
            "split": split.to_dict(),
            "stage": stage,
            "seed": seed,
            "sizes": {k: len(v) for k, v in sets.items()},
        },
    )
