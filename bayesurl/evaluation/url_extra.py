"""URL's further uncertainty checks: centre crops and mixtures of seen and unseen classes.

* **Crop consistency** (URL, Kirchhof et al., 2023, section 4.5, Fig. 4 right; App. C.3): the
  share of images whose centre crop gets a strictly higher ``u`` than the full image. The crop
  keeps an area fraction drawn from ``U[area_range]`` with a fixed seed (docs/concepts/metrics.rst,
  "Other metrics") and is resized back to the input size (bilinear), so the model sees the same
  shape. Also reported: the Spearman correlation of the crops' ``u`` with the crop amount
  ``1 - area`` (more cut away should mean more uncertain).
* **Mixed R-AUROC** (URL App. C.5, Fig. 12): R-AUROC on a 50/50 mixture of in-distribution
  (upstream classes, held-out images) and downstream (unseen-class) queries. Both halves are
  pooled into one retrieval set -- each query's nearest neighbour is searched among all pooled
  queries, and it is correct when it comes from the same half and class -- so ``u`` is
  rewarded both for ranking errors within each half and for telling the halves apart.

Both take plain tensors (the crop check a callable ``images -> u``), so they work for any
estimator; the run pipeline supplies its ``predict``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from bayesurl._checks import check_int, check_same_length, check_tensor
from bayesurl.evaluation.functional import r_at_1, r_auroc, rank_correlation

__all__ = [
    "CropResult",
    "MixedResult",
    "center_crop_resize",
    "crop_consistency",
    "crop_uncertainty_check",
    "mixed_r_auroc",
]


def center_crop_resize(images: Tensor, area: Tensor) -> Tensor:
    """Centre crop keeping the area fraction ``area[i]`` of image ``i``, resized back.

    Output pixel ``(r, c)`` samples the input bilinearly at the centre-scaled position
    ``centre + sqrt(area) * (p - centre)`` of its own position ``p`` (pixel centres,
    ``align_corners=False``; border pixels repeat), i.e. a square-scaled centre crop of side
    ``sqrt(area)`` times the image's, resampled to the full size in one batched
    :func:`torch.nn.functional.grid_sample`.

    Parameters
    ----------
    images : Tensor
        ``[N, C, H, W]`` floating point images.
    area : Tensor
        ``[N]`` kept area fractions in (0, 1].

    Returns
    -------
    Tensor
        ``[N, C, H, W]``, same dtype and device as ``images``.

    Raises
    ------
    ValueError
        On a non-4-D or non-float ``images``, a length mismatch, or ``area`` outside (0, 1].
    """
    x = check_tensor(images, "images", ndim=4, min_points=1)
    if not x.is_floating_point():
        raise ValueError(f"`images` must be floating point, got {x.dtype}")
    a = check_tensor(area, "area", ndim=1).to(device=x.device, dtype=x.dtype)
    check_same_length(("images", x), ("area", a))
    if bool(((a <= 0) | (a > 1)).any()):
        raise ValueError("`area` fractions must lie in (0, 1]")
    s = a.sqrt()
    theta = torch.zeros(x.shape[0], 2, 3, dtype=x.dtype, device=x.device)
    theta[:, 0, 0] = s
    theta[:, 1, 1] = s
    grid = F.affine_grid(theta, list(x.shape), align_corners=False)
    return F.grid_sample(x, grid, mode="bilinear", padding_mode="border", align_corners=False)


def crop_consistency(u_full: Tensor, u_crop: Tensor) -> Tensor:
    """Share of inputs whose crop has a strictly higher ``u`` than the full image (URL 4.5).

    Parameters
    ----------
    u_full, u_crop : Tensor
        ``[N]`` uncertainties of the full images and of their crops.

    Returns
    -------
    Tensor
        0-d float64 in [0, 1]; ties count as "not higher".
    """
    a = check_tensor(u_full, "u_full", ndim=1, min_points=1).double()
    b = check_tensor(u_crop, "u_crop", ndim=1, min_points=1).double()
    check_same_length(("u_full", a), ("u_crop", b))
    return (b > a).double().mean()


class CropResult(NamedTuple):
    """Result of :func:`crop_uncertainty_check`.

    Attributes
    ----------
    share : Tensor
        0-d float64: share of images whose crop gets a strictly higher ``u``.
    spearman : Tensor or None
        0-d float64 Spearman of the crops' ``u`` with ``1 - area``; ``None`` when ``u`` is
        constant (e.g. an estimator without uncertainty).
    area : Tensor
        ``[N]`` the kept area fractions drawn.
    u_full, u_crop : Tensor
        ``[N]`` the uncertainties.
    """

    share: Tensor
    spearman: Tensor | None
    area: Tensor
    u_full: Tensor
    u_crop: Tensor


def crop_uncertainty_check(
    predict_u: Callable[[Tensor], Tensor],
    images: Tensor,
    *,
    area_range: tuple[float, float] = (0.1, 0.75),
    seed: int = 0,
    batch_size: int = 512,
) -> CropResult:
    """URL's crop test (section 4.5, Fig. 4 right) for any ``images -> u`` callable.

    Parameters
    ----------
    predict_u : callable
        Maps a ``[B, C, H, W]`` batch (already normalised as the model expects) to ``[B]``
        uncertainties.
    images : Tensor
        ``[N, C, H, W]`` floating point images.
    area_range : (float, float)
        Range of the uniformly drawn kept-area fraction (default URL App. C.3,
        ``U[0.1, 0.75]``).
    seed : int
        Seed of the area draws (a private generator; global RNG untouched).
    batch_size : int
        Images per ``predict_u`` call.

    Returns
    -------
    CropResult

    Raises
    ------
    ValueError
        On a bad ``area_range`` or ``batch_size``, bad ``images``, or ``predict_u`` returning
        a wrong shape or non-finite values.
    """
    lo, hi = (float(v) for v in area_range)
    if not 0.0 < lo <= hi <= 1.0:
        raise ValueError(f"`area_range` must satisfy 0 < low <= high <= 1, got {area_range}")
    check_int(batch_size, "batch_size", low=1)
    x = check_tensor(images, "images", ndim=4, min_points=1)
    gen = torch.Generator().manual_seed(int(seed))
    area = lo + (hi - lo) * torch.rand(x.shape[0], generator=gen, dtype=torch.float64)
    u_full, u_crop = [], []
    for start in range(0, x.shape[0], int(batch_size)):
        xb = x[start : start + int(batch_size)]
        ab = area[start : start + xb.shape[0]]
        for out, batch in ((u_full, xb), (u_crop, center_crop_resize(xb, ab))):
            u = predict_u(batch)
            u = check_tensor(u, "predict_u(images)", ndim=1)
            if u.shape[0] != batch.shape[0]:
                raise ValueError(
                    f"`predict_u` returned {u.shape[0]} values for a batch of {batch.shape[0]}"
                )
            out.append(u.detach().double().cpu())
    uf, uc = torch.cat(u_full), torch.cat(u_crop)
    share = crop_consistency(uf, uc)
    spear = None
    if uc.numel() >= 2 and float(uc.max() - uc.min()) > 0 and float(area.max() - area.min()) > 0:
        spear = rank_correlation(uc, 1.0 - area)
    return CropResult(share=share, spearman=spear, area=area, u_full=uf, u_crop=uc)


class MixedResult(NamedTuple):
    """Result of :func:`mixed_r_auroc`.

    Attributes
    ----------
    r_auroc : Tensor
        0-d float64 R-AUROC on the pooled, balanced queries.
    r_at_1 : Tensor
        0-d float64 R@1 on them.
    n_per_side : int
        Queries drawn from each side.
    index_a, index_b : Tensor
        Indices of the queries drawn from each side.
    u : Tensor or None
        ``[2n]`` u of the pooled queries (side ``a`` first).
    correct : Tensor or None
        ``[2n]`` bool: each pooled query's nearest neighbour is of its side and class.
    """

    r_auroc: Tensor
    r_at_1: Tensor
    n_per_side: int
    index_a: Tensor
    index_b: Tensor
    u: Tensor | None = None
    correct: Tensor | None = None


def mixed_r_auroc(
    embeddings_a: Tensor,
    labels_a: Tensor,
    u_a: Tensor,
    embeddings_b: Tensor,
    labels_b: Tensor,
    u_b: Tensor,
    *,
    n_per_side: int | None = None,
    seed: int = 0,
) -> MixedResult:
    """R-AUROC on a 50/50 mixture of two query sets (URL App. C.5, Fig. 12).

    ``a`` is typically the in-distribution side (held-out images of the upstream classes) and
    ``b`` the downstream / OOD side. ``n = n_per_side`` (default: the smaller set's size)
    queries are drawn from each side without replacement (seeded, private generator), pooled,
    and each pooled query's nearest neighbour (cosine, self excluded) is correct when it is
    from the same side with the same label. The R-AUROC of ``u`` on these correctness flags
    is returned (:func:`bayesurl.evaluation.r_auroc`).

    Parameters
    ----------
    embeddings_a, embeddings_b : Tensor
        ``[Na, D]`` / ``[Nb, D]`` embeddings (same ``D``).
    labels_a, labels_b : Tensor
        ``[Na]`` / ``[Nb]`` integer labels (the sides' label spaces may overlap; they are
        kept apart).
    u_a, u_b : Tensor
        ``[Na]`` / ``[Nb]`` uncertainties.
    n_per_side : int, optional
        Queries per side; at most ``min(Na, Nb)``.
    seed : int
        Seed of the draws.

    Returns
    -------
    MixedResult

    Raises
    ------
    ValueError
        On length / dimension mismatches, non-finite values, a bad ``n_per_side``, or when
        R-AUROC is undefined (all pooled queries correct or all wrong).
    """
    ea = check_tensor(embeddings_a, "embeddings_a", ndim=2, min_points=1)
    eb = check_tensor(embeddings_b, "embeddings_b", ndim=2, min_points=1)
    if ea.shape[1] != eb.shape[1]:
        raise ValueError(
            f"`embeddings_a` and `embeddings_b` differ in dimension: {ea.shape[1]} vs {eb.shape[1]}"
        )
    ya = check_tensor(labels_a, "labels_a", ndim=1)
    yb = check_tensor(labels_b, "labels_b", ndim=1)
    ua = check_tensor(u_a, "u_a", ndim=1)
    ub = check_tensor(u_b, "u_b", ndim=1)
    check_same_length(("embeddings_a", ea), ("labels_a", ya), ("u_a", ua))
    check_same_length(("embeddings_b", eb), ("labels_b", yb), ("u_b", ub))
    n_max = min(ea.shape[0], eb.shape[0])
    n = n_max if n_per_side is None else int(n_per_side)
    if not 1 <= n <= n_max:
        raise ValueError(f"`n_per_side` must be in [1, {n_max}], got {n_per_side}")
    gen = torch.Generator().manual_seed(int(seed))
    ia = torch.randperm(ea.shape[0], generator=gen)[:n].sort().values
    ib = torch.randperm(eb.shape[0], generator=gen)[:n].sort().values
    dev = ea.device
    ia_d, ib_d = ia.to(dev), ib.to(dev)
    emb = torch.cat([ea[ia_d], eb[ib_d].to(device=dev, dtype=ea.dtype)])
    side = torch.cat([torch.zeros(n, dtype=torch.int64), torch.ones(n, dtype=torch.int64)])
    lab = torch.cat([ya[ia_d].cpu().long(), yb[ib_d.to(yb.device)].cpu().long()])
    _, joint = torch.unique(torch.stack([side, lab], dim=1), dim=0, return_inverse=True)
    u = torch.cat([ua[ia_d.to(ua.device)].double().cpu(), ub[ib_d.to(ub.device)].double().cpu()])
    r1, correct = r_at_1(emb, joint.to(dev))
    return MixedResult(
        r_auroc=r_auroc(u.to(dev), correct),
        r_at_1=r1,
        n_per_side=n,
        index_a=ia,
        index_b=ib,
        u=u,
        correct=correct.cpu(),
    )
