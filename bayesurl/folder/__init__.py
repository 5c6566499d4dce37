"""u(x) for a folder of one's own images: encode, fit a post-hoc u, rank, write the results.

The road of ``bayesurl folder`` (:func:`score_folder`, its settings in :class:`FolderOptions`):

1. **Scan** the folder (:func:`bayesurl.data.folder.scan_image_folder`): class sub-folders
   give labels, a flat folder has none.
2. **Encode**, streaming: each image is decoded once (the next batch is decoded while the
   current one is encoded) and encoded once per view: its plain row through the frozen-feature
   store (:class:`bayesurl.features.FeatureStore`, content-addressed, so a ``cache``
   folder shared by later runs encodes an image it has seen before no more) by the frozen
   backbone (``--backbone``, with its packaged ImageNet weights where ``pretrained``), and,
   for the one method that trains on augmented pairs (``tau``), ``views`` random
   augmentations of up to ``fit_max`` images (a seeded sample, 500 by default), drawn batch
   by batch from one seeded stream; ``pvu`` and ``laplace`` encode the plain view only. A
   progress bar runs; only the ``[N, D]`` features stay in memory, never the images. A file
   that cannot be decoded is skipped with a warning, counted and listed (or, with
   ``strict``, named in a ``ValueError``).
3. **Fit** the post-hoc u (:func:`bayesurl.posthoc.wrap`) on the cached features of the
   fit sample without looking at the labels, so a labelled folder's R@1 and R-AUROC are not
   optimistic. Each fitted image gets one positive partner:

   - ``tau``: post-hoc Temperature as Uncertainty (TaU section 4) on two augmented views of
     each image, its positive pair (instance discrimination, as SimCLR trains);
   - ``pvu``: the PVU loss-prediction head (thesis section 5.3) ranking the per-image
     supervised-contrastive loss of each image against its nearest other image of the fit
     sample (cosine of the plain features), that pair its own class;
   - ``laplace``: a last-layer Laplace (LAM section 3, eq. 3) over a linear read-out that
     starts as the identity, each image and its nearest other image a positive pair; its
     embedding is the backbone's feature, bit for bit.

   The nearest-neighbour pairs (as NNCLR mines its positives, Dwibedi et al., 2021) cost no
   encoding beyond the plain one, so these two methods run at the speed of the extractor.

   Three methods train nothing and are **cross-fitted** instead: the images are dealt into
   5 folds (class by class where there are classes) and each fold's u comes from the wrapper
   fitted on the fit sample's plain features in the other four, so no image is scored by a
   density or neighbour list that holds it (:mod:`bayesurl.posthoc.reference`):

   - ``knn``: the mean cosine distance to the 10 nearest images (Sun et al., 2022);
   - ``mahalanobis``: the squared Mahalanobis distance to the nearest class mean under one
     shared, Ledoit-Wolf-shrunk covariance (Lee et al., 2018); it needs class sub-folders,
     and uses the other folds' labels;
   - ``gmm``: ``-log`` density of a Gaussian mixture of the features, one component per class
     (DDU, Mukhoti et al., 2023; the other folds' labels) or, without classes, 10 k-means
     components.

4. **Rank**: every readable image is a query; its nearest neighbour among the others
   (cosine, docs/concepts/metrics.rst), and, with labels, the evaluator's R@1, R-AUROC, AUSC
   (:func:`bayesurl.evaluation.evaluate`).
5. **Write** ``uncertainty.csv`` (every file of the folder: path, class, u, its rank, the
   nearest neighbour and its class, right / wrong, or the error of an unreadable file),
   its companion page ``README.md`` (the metrics with their 95 % intervals over the images,
   what u is, the columns, and the notes of :mod:`bayesurl.evaluation.notes`: u nearly
   constant, R-AUROC at chance or inverted by its interval, R@1 at chance),
   ``queries.npz`` (:mod:`bayesurl.runs.queries`) and ``folder.json``; the command adds the
   report.

The package's files follow the road: :mod:`~bayesurl.folder.options` (the settings),
:mod:`~bayesurl.folder.encode` (steps 1-2), :mod:`~bayesurl.folder.methods` and
:mod:`~bayesurl.folder.fit` (step 3), :mod:`~bayesurl.folder.write` (step 5) and
:mod:`~bayesurl.folder.road` (:func:`score_folder`, the steps in order).
"""

from __future__ import annotations

from bayesurl.folder.methods import CROSSFIT_FOLDS, U_MEANING, U_MEASURED, FolderMethod
from bayesurl.folder.options import DEFAULT_MAX_PIXELS, FolderOptions
from bayesurl.folder.road import FolderResult, score_folder
from bayesurl.folder.write import FOLDER_FILE, FOLDER_FORMAT

__all__ = [
    "CROSSFIT_FOLDS",
    "DEFAULT_MAX_PIXELS",
    "FOLDER_FILE",
    "FOLDER_FORMAT",
    "U_MEANING",
    "U_MEASURED",
    "FolderMethod",
    "FolderOptions",
    "FolderResult",
    "score_folder",
]
