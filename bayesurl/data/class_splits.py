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

**Tuning that never sees an evaluated class.** The settings a search chooses on a split's
validation classes are only clean for runs on which those classes are not downstream: a
choice scored on images that are later the evaluated queries is selection on the test set.
:func:`crossfit_splits` builds the splits of a cross-fitted protocol for any number of classes
from two or more disjoint **validation sets** ``V_1, V_2, ...``: for each ordered choice
``V_g`` upstream, ``V_h`` downstream (``g < h``) the rest of the upstream classes is drawn from
the classes in no validation set, and every such split comes with its complement (``V_h``
upstream, ``V_g`` downstream). A split's ``val`` is the validation set on its upstream side:
the one whose tuned settings its runs use, so no run's settings were chosen on one of its
downstream classes. :func:`bayesurl.sweeps.tuning.tuning_leaks` checks run records for exactly that.
"""

from __future__ import annotations

import itertools
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from bayesurl._checks import check_int

from .base import subset
from .registry import DATASETS, pool_datasets
from .splits import capped
from .zero_shot import ZeroShotData

__all__ = [
    "ClassSplit",
    "class_splits",
    "crossfit_splits",
    "split_data",
]


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
    val_classes: Sequence[int] | None = None,
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
    val_classes : sequence of int, optional
        Fixed validation classes: upstream in every split (the ``val`` of every split) and
        never downstream, so settings tuned on them are clean for every split. The other
        classes are split as above (``n_upstream`` of them upstream, default half) and
        ``n_val`` is ignored.

    Returns
    -------
    list of ClassSplit

    Raises
    ------
    ValueError
        On counts out of range, or when ``n_splits`` distinct splits do not exist.
    """
    n_splits = check_int(n_splits, "n_splits", low=1)
    k = check_int(num_classes, "num_classes", low=2)
    seed = check_int(seed, "seed", low=0)
    n_val = check_int(n_val, "n_val", low=1)
    if n_upstream is not None:
        n_upstream = check_int(n_upstream, "n_upstream", low=1)
    if val_classes is not None:
        return _fixed_val_splits(n_splits, k, n_upstream, val_classes, seed)
    n_up = k // 2 if n_upstream is None else n_upstream
    if not 1 <= n_up < k:
        raise ValueError(f"`n_upstream` must be in [1, {k - 1}], got {n_upstream}")
    if not 1 <= int(n_val) < n_up:
        raise ValueError(f"`n_val` must be in [1, {n_up - 1}] (upstream {n_up}), got {n_val}")
    if int(n_splits) > math.comb(k, n_up):
        raise ValueError(
            f"cannot draw {n_splits} distinct splits: only {math.comb(k, n_up)} ways to choose "
            f"{n_up} of {k} classes"
        )
    gen = torch.Generator().manual_seed(int(seed))
    out = []
    for i, up in enumerate(_distinct_upstreams(int(n_splits), k, n_up, gen)):
        down = tuple(c for c in range(k) if c not in up)
        perm = torch.randperm(len(up), generator=gen)[: int(n_val)].tolist()
        val = tuple(sorted(up[j] for j in perm))
        out.append(ClassSplit(index=i, upstream=up, downstream=down, val=val))
    return out


def _distinct_upstreams(
    n_splits: int, k: int, n_up: int, gen: torch.Generator
) -> list[tuple[int, ...]]:
    """``n_splits`` distinct upstream class sets of size ``n_up``: the lowest classes first,
    then seeded draws, each followed by its complement when ``n_up`` is half of ``k``."""
    paired = 2 * n_up == k
    ups: list[tuple[int, ...]] = []
    seen: set[tuple[int, ...]] = set()
    tries = 0
    while len(ups) < n_splits:
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
        if paired and len(ups) < n_splits:
            ups.append(comp)
            seen.add(comp)
    return ups


def _fixed_val_splits(
    n_splits: int, k: int, n_upstream: int | None, val_classes: Sequence[int], seed: int
) -> list[ClassSplit]:
    """:func:`class_splits` of the classes outside ``val_classes``, which join every upstream."""
    val = _classes(val_classes, "val_classes")
    bad = [c for c in val if not 0 <= c < k]
    if bad:
        raise ValueError(f"`val_classes` names classes {bad} outside 0..{k - 1}")
    rest = [c for c in range(k) if c not in val]
    if not val or len(rest) < 2:
        raise ValueError(
            f"`val_classes` must name at least one class and leave two of {k}, got {list(val)}"
        )
    inner = class_splits(n_splits, num_classes=len(rest), n_upstream=n_upstream, n_val=1, seed=seed)
    out = []
    for sp in inner:
        up = tuple(sorted((*val, *(rest[c] for c in sp.upstream))))
        down = tuple(rest[c] for c in sp.downstream)
        out.append(ClassSplit(index=sp.index, upstream=up, downstream=down, val=val))
    return out


def _classes(values: Any, name: str) -> tuple[int, ...]:
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise ValueError(f"`{name}` must be a list of class indices, got {values!r}")
    try:
        out = tuple(sorted(check_int(v, f"{name}[{i}]", low=0) for i, v in enumerate(values)))
    except TypeError:  # not numbers at all
        raise ValueError(f"`{name}` must be a list of class indices, got {values!r}") from None
    if len(set(out)) != len(out):
        raise ValueError(f"`{name}` repeats a class: {list(values)!r}")
    return out


def crossfit_splits(
    val_sets: Sequence[Sequence[int]],
    *,
    num_classes: int = 10,
    n_upstream: int | None = None,
    n_splits: int | None = None,
    seed: int = 0,
) -> list[ClassSplit]:
    """Class splits of a cross-fitted protocol: no split's ``val`` is downstream (module docs).

    For every ordered pair of validation sets ``(V_g, V_h)``, ``g < h``, each choice of the
    remaining ``n_upstream - |V_g|`` upstream classes among the classes in no validation set
    gives a split with ``V_g`` upstream (its ``val``) and ``V_h`` downstream; with
    ``n_upstream = num_classes / 2`` and ``|V_g| = |V_h|`` it is followed by its complement
    (``V_h`` upstream and its ``val``, ``V_g`` downstream), so every class is downstream
    equally often. Split 0 holds ``V_1`` and the lowest free classes upstream and split 1 is
    its complement (the splits a tuning of ``V_1`` and of ``V_2`` trains on); the other pairs
    follow in a seeded random order, so a protocol stopped early has run a random sample of
    pairs.

    Parameters
    ----------
    val_sets : sequence of sequence of int
        Two or more disjoint sets of validation classes, each smaller than ``n_upstream``.
    num_classes : int
        Classes ``0..num_classes-1``.
    n_upstream : int, optional
        Upstream classes per split; default ``num_classes // 2``.
    n_splits : int, optional
        Keep the first this many splits (even for complementary pairs); default all of them.
    seed : int
        Seed of the order of the pairs after the first.

    Returns
    -------
    list of ClassSplit
        Indexed ``0..n-1``; complementary pairs at ``2j`` / ``2j + 1``.

    Raises
    ------
    ValueError
        On fewer than two validation sets, overlapping sets, a class outside the data, a set
        that does not fit upstream, an odd ``n_splits`` with complementary pairs, or more
        splits asked for than exist.
    """
    k = check_int(num_classes, "num_classes", low=2)
    seed = check_int(seed, "seed", low=0)
    if n_splits is not None:
        n_splits = check_int(n_splits, "n_splits", low=1)
    n_up = k // 2 if n_upstream is None else check_int(n_upstream, "n_upstream", low=1)
    if not 1 <= n_up < k:
        raise ValueError(f"`n_upstream` must be in [1, {k - 1}], got {n_upstream}")
    sets = _val_sets(val_sets, k, n_up)
    base, paired = _crossfit_pairs(sets, k, n_up)
    units = [base[i : i + 2] for i in range(0, len(base), 2)] if paired else [[b] for b in base]
    # the first unit (the lowest free classes: the splits the searches train on) leads, the
    # others follow in a seeded order, so any prefix of the plan is a random sample of pairs
    gen = torch.Generator().manual_seed(int(seed))
    order = [0, *(1 + torch.randperm(len(units) - 1, generator=gen)).tolist()]
    units = [units[i] for i in order]
    if n_splits is not None:
        n = int(n_splits)
        if n < 1 or n > len(base):
            raise ValueError(f"`n_splits` must be in [1, {len(base)}], got {n_splits}")
        if paired and n % 2:
            raise ValueError(f"`n_splits` must be even (complementary pairs), got {n_splits}")
        units = units[: n // 2 if paired else n]
    out = []
    for up, val in (s for unit in units for s in unit):
        down = tuple(c for c in range(k) if c not in up)
        out.append(ClassSplit(index=len(out), upstream=up, downstream=down, val=val))
    return out


def _val_sets(val_sets: Sequence[Sequence[int]], k: int, n_up: int) -> list[tuple[int, ...]]:
    """The validation sets of :func:`crossfit_splits`, checked: two or more, disjoint, each
    within the classes and fitting upstream and downstream."""
    sets = [_classes(v, f"val_sets[{i}]") for i, v in enumerate(val_sets)]
    if len(sets) < 2:
        raise ValueError(
            f"`val_sets` needs at least two validation sets (cross-fitting), got {len(sets)}"
        )
    seen: set[int] = set()
    for i, v in enumerate(sets):
        if not v:
            raise ValueError(f"`val_sets[{i}]` is empty")
        bad = [c for c in v if not 0 <= c < k]
        if bad:
            raise ValueError(f"`val_sets[{i}]` names classes {bad} outside 0..{k - 1}")
        if seen & set(v):
            raise ValueError(f"`val_sets` overlap in classes {sorted(seen & set(v))}")
        if len(v) >= n_up or len(v) > k - n_up:
            raise ValueError(
                f"`val_sets[{i}]` ({len(v)} classes) must fit upstream ({n_up} classes, one "
                f"trained class at least) and downstream ({k - n_up} classes)"
            )
        seen |= set(v)
    return sets


def _crossfit_pairs(
    sets: list[tuple[int, ...]], k: int, n_up: int
) -> tuple[list[tuple[tuple[int, ...], tuple[int, ...]]], bool]:
    """``(upstream, val)`` of every split of :func:`crossfit_splits` in canonical order, each
    followed by its complement where it has one, and whether all of them have one."""
    seen = {c for v in sets for c in v}
    free = [c for c in range(k) if c not in seen]
    base: list[tuple[tuple[int, ...], tuple[int, ...]]] = []
    paired = True
    for g, h in itertools.combinations(range(len(sets)), 2):
        need = n_up - len(sets[g])
        if need > len(free):
            raise ValueError(
                f"`val_sets[{g}]` leaves {need} upstream classes to fill from {len(free)} free ones"
            )
        for rest in itertools.combinations(free, need):
            up = tuple(sorted((*sets[g], *rest)))
            comp = tuple(c for c in range(k) if c not in up)
            twin = set(sets[h]) <= set(comp) and len(comp) == n_up
            paired = paired and twin
            base.append((up, sets[g]))
            if twin:
                base.append((comp, sets[h]))
    return base, paired


def _stage_classes(split: ClassSplit, stage: str) -> tuple[list[int], list[int]]:
    """The classes trained on and the classes retrieved among at ``stage``."""
    if stage == "final":
        return list(split.upstream), list(split.downstream)
    return [c for c in split.upstream if c not in split.val], list(split.val)


def _select(
    pool: Any,
    held: torch.Tensor,
    fit_cls: list[int],
    eval_cls: list[int],
    caps: Mapping[str, int | None],
    seed: int,
) -> dict[str, Any]:
    """``train`` (trained classes, not held out), ``test`` (every image of the retrieved
    classes) and ``id_test`` (trained classes, held out), each capped class-balanced."""
    y = pool.targets
    fit_mask = torch.isin(y, torch.tensor(fit_cls))
    relabel = {c: i for i, c in enumerate(fit_cls)}
    train = subset(pool, (fit_mask & ~held).nonzero().flatten(), relabel=relabel)
    test = subset(pool, torch.isin(y, torch.tensor(eval_cls)).nonzero().flatten())
    id_test = subset(pool, (fit_mask & held).nonzero().flatten(), relabel=relabel)
    return {
        "train": capped(train, caps["max_train"], seed),
        "test": capped(test, caps["max_test"], seed),
        "id_test": capped(id_test, caps["max_id"], seed),
    }


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
    image_size: int | None = None,
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
        The data set's location (default: its loader's).
    dataset : str
        A data set that declares a ``pool`` (:func:`bayesurl.data.registry.pool_datasets`:
        ``"fashion_mnist"``, ``"digits"``, ``"clipart"`` and any registered one); its pool
        fixes the held-out images and the OOD set (digits: 1,797 images, OOD = seeded noise
        images; clipart: the Open Clip Art drawings, 20 % of each class held out, OOD =
        Fashion-MNIST's test images, or the digits where it is absent).
    max_train, max_test, max_id, max_ood : int, optional
        Class-balanced caps on ``train``, ``test`` (retrieval), ``id_test`` and ``ood``.
    transform : callable, optional
        Per-item transform of every set.
    seed : int
        Seed of the caps and of the held-out split (digits, clipart).
    image_size : int, optional
        Side of the clipart images (default 128); the embedded sets keep their 28 px.

    Returns
    -------
    ZeroShotData
        ``train`` relabelled to ``0..K-1`` in the order of the trained classes; ``test`` and
        ``ood`` with original labels; ``id_test`` relabelled like ``train``; ``val`` empty.
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
    make_pool, dataset = _pool_maker(dataset)
    caps = {"max_train": max_train, "max_test": max_test, "max_id": max_id, "max_ood": max_ood}
    _check_caps(caps)
    pool, held, ood, ood_name = make_pool(root, seed, image_size)
    _check_split_classes(split, pool, dataset)
    fit_cls, eval_cls = _stage_classes(split, stage)
    sets = {**_select(pool, held, fit_cls, eval_cls, caps, seed), "ood": capped(ood, max_ood, seed)}
    for key, ds in sets.items():
        ds.name = f"{pool.name}/split{split.index}/{stage}/{key}" if key != "ood" else ood.name
        sets[key] = ds.with_transform(transform)
    sizes = {k: len(v) for k, v in sets.items()}
    return ZeroShotData(
        name=dataset,
        **sets,
        val=subset(pool, torch.empty(0, dtype=torch.int64)).with_transform(transform),
        ood_name=ood_name,
        upstream_classes=fit_cls,
        downstream_classes=eval_cls,
        num_train_classes=len(fit_cls),
        image_shape=tuple(pool.images.shape[1:]),  # type: ignore[arg-type]
        info={"split": split.to_dict(), "stage": stage, "seed": seed, "sizes": sizes},
    )


def _pool_maker(dataset: str) -> tuple[Callable[..., Any], str]:
    """The ``pool`` a data set declares and its registered name (``dataset`` as typed in the
    error when it declares none)."""
    make_pool = DATASETS.traits(dataset).get("pool") if dataset in DATASETS else None
    if make_pool is None:
        raise ValueError(f"`dataset` must be one of {list(pool_datasets())}, got {dataset!r}")
    return make_pool, DATASETS.entry(dataset).name


def _check_caps(caps: Mapping[str, int | None]) -> None:
    for arg, v in caps.items():
        if v is not None:
            check_int(v, arg, low=1)


def _check_split_classes(split: ClassSplit, pool: Any, dataset: str) -> None:
    present = set(pool.targets.unique().tolist())
    bad = sorted({*split.upstream, *split.downstream} - present)
    if bad:
        raise ValueError(f"`split` names classes {bad} that {dataset} does not have")
