"""Data for the zero-shot protocol of URL (Kirchhof et al., 2023, Sec. 3.2).

* Data sets: :func:`fashion_mnist`, :func:`digits`, :class:`CUB200`, :class:`Cars196`,
  :class:`StanfordOnlineProducts`, by name through :func:`get_dataset`; a new one declares
  itself with :func:`register_dataset` (:mod:`bayesurl.data.registry`).
* Splits: :func:`zero_shot_split` (class lists or a seeded permutation), :func:`split_classes`,
  :func:`stratified_split`, :func:`stratified_subsample` (a capped set: :func:`capped`), views
  via :func:`subset`.
* The embedded default experiment: :func:`default_zero_shot` -> :class:`ZeroShotData`; LAM's
  closed-set protocol on the same data: :func:`closed_set` (``SPLITS`` by :class:`Split`).
* Transforms: :func:`default_transform`, :func:`default_augmentation`, :class:`TwoViews`.
* Loaders: :func:`make_loader` (seeded, DistributedSampler-aware), :func:`set_epoch`,
  :class:`TransformedLoader` (its batches moved to a device and transformed there),
  :func:`as_tensors` (a whole in-memory set as tensors); :func:`plot_images` to look at them.
* Batches: :func:`unpack_batch`, the one reader of ``x`` / ``(x, y)`` / ``((x1, x2), y)`` /
  dict loader batches.
"""

from .base import (
    ImageFileDataset,
    ImageTensorDataset,
    LabeledSubset,
    as_tensors,
    get_targets,
    subset,
)
from .batch import unpack_batch
from .dml import (
    CARS_TEST_CLASSES,
    CARS_TRAIN_CLASSES,
    CUB200,
    CUB_TEST_CLASSES,
    CUB_TRAIN_CLASSES,
    DML_SPLITS,
    Cars196,
    StanfordOnlineProducts,
    select_split_classes,
)
from .fmnist import (
    DEFAULT_FASHION_MNIST_ROOT,
    FASHION_MNIST_CLASSES,
    fashion_mnist,
    find_fashion_mnist,
)
from .idx import read_idx
from .loaders import TransformedLoader, UnpaddedDistributedSampler, make_loader, set_epoch
from .plot import plot_images
from .registry import DatasetKind, available_datasets, get_dataset, register_dataset
from .sklearn_digits import digits, load_digits_images, upsample_uint8
from .splits import (
    capped,
    check_disjoint,
    split_classes,
    stratified_split,
    stratified_subsample,
    zero_shot_split,
)
from .transforms import (
    FASHION_MNIST_MEAN,
    FASHION_MNIST_STD,
    GaussianNoise,
    Normalize,
    PilToUint8,
    RandomResizedCropFlip,
    RepeatChannels,
    Resize,
    ToFloat,
    TwoViews,
    default_augmentation,
    default_transform,
)
from .zero_shot import (
    SPLITS,
    Split,
    ZeroShotData,
    ZeroShotOptions,
    closed_set,
    default_zero_shot,
    dml_zero_shot,
    synthetic_ood,
)

__all__ = [
    "CARS_TEST_CLASSES",
    "CARS_TRAIN_CLASSES",
    "CUB_TEST_CLASSES",
    "CUB_TRAIN_CLASSES",
    "DEFAULT_FASHION_MNIST_ROOT",
    "DML_SPLITS",
    "FASHION_MNIST_CLASSES",
    "FASHION_MNIST_MEAN",
    "FASHION_MNIST_STD",
    "CUB200",
    "Cars196",
    "DatasetKind",
    "GaussianNoise",
    "ImageFileDataset",
    "ImageTensorDataset",
    "LabeledSubset",
    "Normalize",
    "PilToUint8",
    "RandomResizedCropFlip",
    "RepeatChannels",
    "Resize",
    "SPLITS",
    "Split",
    "StanfordOnlineProducts",
    "ToFloat",
    "TwoViews",
    "TransformedLoader",
    "UnpaddedDistributedSampler",
    "ZeroShotData",
    "ZeroShotOptions",
    "as_tensors",
    "available_datasets",
    "capped",
    "check_disjoint",
    "closed_set",
    "default_augmentation",
    "default_transform",
    "default_zero_shot",
    "digits",
    "dml_zero_shot",
    "fashion_mnist",
    "find_fashion_mnist",
    "get_dataset",
    "get_targets",
    "load_digits_images",
    "make_loader",
    "plot_images",
    "read_idx",
    "register_dataset",
    "select_split_classes",
    "set_epoch",
    "split_classes",
    "stratified_split",
    "stratified_subsample",
    "subset",
    "synthetic_ood",
    "unpack_batch",
    "upsample_uint8",
    "zero_shot_split",
]
