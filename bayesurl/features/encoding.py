"""Running a frozen encoder: the post-hoc input rule and the one embedding loop.

Once an encoder is frozen its embeddings are a data source (the PVU thesis' "cache
everything", section 5.3). Every post-hoc fit, cache and prediction encodes with
:func:`encode` (one dtype rule, finite inputs and outputs checked); :func:`encode_batches` is
the one loop that runs a frozen encoder over batches, with optional augmentation draws (it
fills the store's shards, :mod:`bayesurl.features.store`); :class:`FrozenEncoder` is a
backbone behind its image transform and resize, as the frozen-feature runs and
``bayesurl folder`` encode images.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from torch import Tensor, nn

from bayesurl._checks import check_finite, check_int, check_ndim, match_module_dtype
from bayesurl._modules import device_of, eval_mode
from bayesurl.data.batch import iterate, unpack_batch
from bayesurl.data.transforms import Resize

__all__ = ["FrozenEncoder", "encode", "encode_batches"]


def encode(encoder: nn.Module, x: object, name: str = "x") -> Tensor:
    """The frozen ``encoder``'s embedding ``[N, D]`` of ``x``, under the post-hoc input rule.

    One dtype rule for every post-hoc fit, cache and prediction: a floating ``x`` (float64,
    float32, float16, bfloat16) is cast to the encoder's floating parameter dtype, since the
    frozen encoder defines the precision it computes in; an integer or bool ``x`` (e.g.
    ``uint8`` images for an encoder that scales them itself) is passed unchanged, and an
    encoder that cannot take it is refused with a :class:`TypeError` naming ``name``.

    Raises
    ------
    ValueError
        If ``x`` holds NaN / inf (named ``name``, before the encoder runs), or the encoder
        returns something else than a finite ``[N, D]`` tensor.
    TypeError
        If the encoder fails on an integer / bool ``x``.
    """
    if isinstance(x, Tensor):
        check_finite(x, name)
    x = match_module_dtype(x, encoder)
    try:
        e = encoder(x)
    except (RuntimeError, NotImplementedError) as exc:
        if isinstance(x, Tensor) and not x.is_floating_point():
            raise TypeError(
                f"the encoder cannot take the {x.dtype} `{name}` ({exc}); give floating-point "
                f"input (e.g. `{name}.float()`, `/ 255` for images)"
            ) from exc
        raise
    if not isinstance(e, Tensor):
        raise ValueError(
            f"the encoder must return a tensor [N, D], got {type(e).__name__}; wrap a "
            "module whose forward returns the embedding"
        )
    check_ndim(e, "encoder output", 2)
    check_finite(e, "encoder output")
    return e


@torch.no_grad()
def encode_batches(
    encoder: nn.Module,
    batches: Iterable[Any],
    *,
    plain: bool = True,
    views: int = 0,
    augment: Callable[[Tensor], Tensor] | None = None,
    view_encoder: nn.Module | None = None,
    progress: bool = True,
    desc: str = "encoding",
    total: int | None = None,
) -> Iterator[tuple[Tensor, Tensor | None]]:
    """Run a frozen encoder over ``batches``: the one embedding loop of the store.

    Per batch ``x`` or ``(x, y)`` (:func:`bayesurl.data.batch.unpack_batch`), moved to the
    encoder's device: the plain row ``encoder(x)`` (with ``plain``), then ``views``
    augmented rows ``view_encoder(augment(x))``, each call of ``augment`` a fresh draw (in
    batch order, then view order: a seeded ``augment`` gives the same rows on every run).
    The encoders run in eval mode (their training flags restored afterwards) without
    gradients, under the post-hoc input rule (:func:`encode`).

    Parameters
    ----------
    encoder : nn.Module
        Maps inputs to embeddings ``[B, D]``.
    batches : iterable
        Yields ``x`` or ``(x, y)`` (one view per item).
    plain : bool
        Encode ``x`` itself as row 0.
    views : int
        Augmented rows per item.
    augment : callable or None
        ``x -> `` the input of ``view_encoder``; required for ``views > 0``.
    view_encoder : nn.Module or None
        Encoder of the augmented inputs (default: ``encoder``).
    progress : bool
        Show a tqdm bar named ``desc`` that counts images.
    total : int or None
        The images ``batches`` yields, for the bar's total and time left (default: asked of a
        :class:`~torch.utils.data.DataLoader`, whose sampler knows it).

    Yields
    ------
    embeddings : Tensor
        ``[B, V, D]`` on the CPU in the encoder's dtype, ``V = plain + views``.
    labels : Tensor or None
        The batch's ``y``.
    """
    if check_int(views, "views", low=0) + int(plain) < 1:
        raise ValueError(f"nothing to encode: plain={plain}, views={views}")
    if views and augment is None:
        raise ValueError("`augment` is required for `views` > 0")
    view_encoder = encoder if view_encoder is None else view_encoder
    device = device_of(encoder)
    with contextlib.ExitStack() as stack:
        stack.enter_context(eval_mode(encoder))
        stack.enter_context(eval_mode(view_encoder))
        for batch in iterate(batches, progress, desc, total=total):
            x, y = unpack_batch(batch)
            if not isinstance(x, Tensor):
                raise ValueError(
                    "the embedding loop needs single-view batches x or (x, y), got a pair of "
                    "views; encode each view's loader separately"
                )
            x = x.to(device)
            rows = [encode(encoder, x)] if plain else []
            for _ in range(int(views)):
                rows.append(encode(view_encoder, augment(x)))  # type: ignore[misc]
            yield torch.stack(rows, dim=1).cpu(), y


class FrozenEncoder(nn.Module):
    """``uint8`` images -> transform -> resize to ``resolution`` -> frozen backbone features.

    Parameters
    ----------
    backbone : nn.Module
        Maps ``[N, C, R, R]`` inputs to features ``[N, F]``.
    transform : nn.Module
        ``uint8`` batch -> normalised float batch with the backbone's channels.
    resolution : int
        Side the images are resized to (bilinear) before the backbone.
    """

    def __init__(self, backbone: nn.Module, transform: nn.Module, resolution: int) -> None:
        super().__init__()
        self.backbone, self.transform, self.resolution = backbone, transform, int(resolution)
        self.resize = Resize(self.resolution)
        # frozen: in eval mode from the start, so that the loop's eval_mode block restores
        # eval mode, not a new module's training flag, to the backbone
        self.eval()

    def forward(self, images: Tensor) -> Tensor:
        return self.backbone(self.resize(self.transform(images)))
