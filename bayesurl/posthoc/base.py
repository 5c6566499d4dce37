"""The common shell of every post-hoc wrapper: a frozen encoder plus an uncertainty part.

A wrapper returns the encoder's embedding untouched (bit for bit) and adds ``u(x)``; see
:func:`bayesurl.posthoc.wrap`. Only the added part is trained (the PVU "StopGrad", thesis
section 5.3) and only it is written by :meth:`PosthocWrapper.save`.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from bayesurl._checks import check_output_file, load_refusal
from bayesurl._modules import device_of, eval_mode
from bayesurl.backbones import watch_input_range
from bayesurl.features.encoding import encode
from bayesurl.files import atomic_open
from bayesurl.registry import Registry
from bayesurl.types import Output

__all__ = [
    "FORMAT",
    "WRAPPERS",
    "MethodEncoder",
    "PosthocOutput",
    "PosthocWrapper",
    "as_encoder",
    "known_embedding_dim",
    "load",
    "register_wrapper",
    "wrapper_class",
    "wrapper_names",
]

#: tag written into every saved wrapper
FORMAT = "bayesurl.posthoc/1"
#: Post-hoc wrapper classes by name (``wrap(encoder, method=<name>)``); filled by the
#: ``register_wrapper`` decorators of the modules that :mod:`bayesurl.posthoc` imports.
WRAPPERS: Registry[type[PosthocWrapper]] = Registry("wrapper")


class PosthocOutput(Output):
    """An :class:`~bayesurl.types.Output` that also unpacks as ``(embedding, uncertainty)``.

    ``emb, u = wrapped(x)`` (the PVU "dual-output API", thesis section 5.3) and
    ``wrapped(x).embedding`` both work; every other ``Output`` field is kept.
    """

    def __iter__(self) -> Iterator[Tensor]:
        yield self.embedding
        yield self.uncertainty

    def __len__(self) -> int:
        return 2

    def to(self, *args: Any, **kwargs: Any) -> PosthocOutput:
        return PosthocOutput(**vars(super().to(*args, **kwargs)))

    def detach(self) -> PosthocOutput:
        return PosthocOutput(**vars(super().detach()))


class MethodEncoder(nn.Module):
    """A :class:`~bayesurl.methods.base.Method` seen as an encoder: ``x -> method(x).embedding``.

    Lets every URL method of the registry be wrapped post hoc; :func:`~bayesurl.posthoc.wrap` and
    :func:`~bayesurl.posthoc.load` apply it to a ``Method`` automatically.

    Parameters
    ----------
    method : Method
        A trained method.
    """

    def __init__(self, method: nn.Module) -> None:
        super().__init__()
        self.method = method
        dim = getattr(method, "embed_dim", None)
        if isinstance(dim, int):
            self.embed_dim = dim

    def forward(self, x: Tensor) -> Tensor:
        return self.method(x).embedding


def probe_width(encoder: nn.Module, input_shape: Sequence[int]) -> int | None:
    """Output width of ``encoder`` on two zero items of ``input_shape`` (eval mode, no grad);
    ``None`` when the encoder does not return a 2-D tensor for them."""
    dtype = next((p.dtype for p in encoder.parameters() if p.is_floating_point()), None)
    x = torch.zeros((2, *input_shape), dtype=dtype or torch.float32, device=device_of(encoder))
    with eval_mode(encoder), torch.no_grad():
        try:
            e = encoder(x)
        except (RuntimeError, ValueError, TypeError):
            return None
    return int(e.shape[1]) if isinstance(e, Tensor) and e.ndim == 2 else None


def as_encoder(encoder: nn.Module) -> nn.Module:
    """``encoder`` itself, or a :class:`MethodEncoder` around a registry method.

    An encoder that declares its input (a timm model) gets
    :func:`~bayesurl.backbones.watch_input_range`: one warning for images outside it.
    """
    from bayesurl.methods.base import Method

    if isinstance(encoder, Method):
        return MethodEncoder(encoder)
    watch_input_range(encoder)
    return encoder


def register_wrapper(name: str, **traits: Any):
    """Class decorator naming a wrapper for :func:`bayesurl.posthoc.wrap` and :func:`load`.

    Parameters
    ----------
    name : str
        The ``method`` name of :func:`~bayesurl.posthoc.wrap` (also set as ``cls.method``).
    **traits
        What the wrapper declares about itself (:class:`~bayesurl.registry.Registry`).
        ``fit_inputs``: what a recipe's post-hoc estimator hands its ``fit``:
        ``"transformed"`` (default: the images under the deterministic transform),
        ``"augmented"`` (one augmented view per image, and ``batch_size``) or ``"raw"``
        (untransformed images, and the ``augment`` module to draw views with).
    """

    def deco(cls: type[PosthocWrapper]) -> type[PosthocWrapper]:
        cls.method = name
        return WRAPPERS.register(name, **traits)(cls)

    return deco


def wrapper_names() -> list[str]:
    """The names of the registered wrappers (``gmm``, ``knn``, ``laplace`` ...), sorted."""
    return sorted(WRAPPERS.names())


def wrapper_class(name: str, *, argument: str = "method") -> type[PosthocWrapper]:
    """The wrapper class registered under ``name``.

    Raises
    ------
    ValueError
        For an unknown name, naming ``argument`` and listing the valid names.
    """
    return WRAPPERS.get(name, argument=argument)


def known_embedding_dim(encoder: nn.Module) -> int | None:
    """The embedding width ``encoder`` returns, where its type says so without a forward pass.

    Only structural facts count: an ``nn.Linear`` (its ``out_features``), an ``nn.Sequential``
    ending in one, and a registry method (its ``embed_dim``, via
    :class:`MethodEncoder`). Attributes such as timm's
    ``num_features`` (the width *before* the classifier head) or a ViT's ``embed_dim``
    describe internals, not the output, so everything else returns ``None`` and the wrappers
    build their head from the first embeddings the encoder actually returns.
    """
    if isinstance(encoder, nn.Linear):
        return int(encoder.out_features)
    if isinstance(encoder, nn.Sequential) and len(encoder) > 0:
        return known_embedding_dim(encoder[-1]) if isinstance(encoder[-1], nn.Linear) else None
    if isinstance(encoder, MethodEncoder) and isinstance(getattr(encoder, "embed_dim", None), int):
        return int(encoder.embed_dim)
    return None


def check_embedding_width(embedding: Tensor, expected: int, what: str) -> None:
    """Raise if the encoder's embeddings do not have the width the ``what`` was built for."""
    if embedding.shape[1] != expected:
        raise ValueError(
            f"the encoder returns {embedding.shape[1]}-dim embeddings, but the {what} was "
            f"built for {expected} (`embed_dim`); wrap / load with the encoder it was fitted on"
        )


class PosthocWrapper(nn.Module):
    """Base class: ``encoder`` (frozen, kept in eval mode) + the trainable uncertainty part.

    Subclasses implement :meth:`uncertainty_from` and :meth:`fit`, and list their constructor
    options in :meth:`config` so that :func:`load` can rebuild them.

    Parameters
    ----------
    encoder : nn.Module
        Any module mapping inputs to embeddings ``[N, D]``. It is not copied: the wrapper holds
        it as its ``encoder`` submodule, keeps it in eval mode (so its embedding, e.g. with
        BatchNorm or dropout, is the deterministic one) and never updates its weights.
    """

    method: ClassVar[str] = ""
    #: ``sample(x, n)`` is available
    has_distribution: ClassVar[bool] = False

    def __init__(self, encoder: nn.Module) -> None:
        super().__init__()
        if not isinstance(encoder, nn.Module):
            raise TypeError(f"`encoder` must be an nn.Module, got {type(encoder).__name__}")
        self.encoder = encoder
        self.encoder.eval()
        #: set by a successful ``fit`` (saved with the state): predicting before raises
        self.fitted = False
        #: shape of one input item as last seen by :meth:`embed` (saved by :meth:`save`)
        self.input_shape: tuple[int, ...] | None = None

    # -- frozen encoder -----------------------------------------------------------------------
    def train(self, mode: bool = True) -> PosthocWrapper:
        """Set the uncertainty part's mode; the encoder always stays in eval mode."""
        super().train(mode)
        self.encoder.eval()
        return self

    def embed(self, x: Tensor) -> Tensor:
        """The encoder's embedding ``[N, D]``, exactly as the encoder returns it
        (:func:`encode`: the post-hoc input rule and its checks)."""
        if isinstance(x, Tensor) and x.ndim >= 1:  # saved, so that `load` can probe the width
            self.input_shape = tuple(int(d) for d in x.shape[1:])
        return encode(self.encoder, x)

    def check_fitted(self) -> None:
        """Raise unless :meth:`fit` ran (or a fitted state was loaded)."""
        if not self.fitted:
            raise ValueError(
                f"the {self.method!r} wrapper is not fitted: call `fit(loader)` (or load a "
                "fitted one) before predicting; its u(x) would come from an untrained part"
            )

    def uncertainty_from(self, embedding: Tensor) -> Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def forward(self, x: Tensor) -> PosthocOutput:
        """``(embedding, uncertainty)``: the encoder's embedding and u(x) (higher = less sure)."""
        e = self.embed(x)
        self.check_embedding(e)
        self.check_fitted()
        return PosthocOutput(embedding=e, uncertainty=self.uncertainty_from(e.detach()))

    def check_embedding(self, embedding: Tensor) -> None:
        """Raise if the encoder's embeddings do not fit the trained part (default: no check)."""

    def sample(self, x: Tensor, n: int) -> Tensor:
        """``[n, N, D]`` draws of the embedding distribution (only where one is defined)."""
        raise ValueError(
            f"method {self.method!r} defines no embedding distribution; `sample` needs "
            "method='laplace'"
        )

    # -- persistence --------------------------------------------------------------------------
    def config(self) -> dict[str, Any]:
        """Constructor options (plain Python values) needed to rebuild this wrapper."""
        return {}

    def get_extra_state(self) -> dict[str, Any]:
        """Saved with the state: whether the wrapper was fitted."""
        return {"fitted": bool(self.fitted)}

    def set_extra_state(self, state: Any) -> None:
        if not isinstance(state, dict) or not isinstance(state.get("fitted"), bool):
            raise ValueError(f"saved {self.method!r} wrapper state is corrupted (`fitted`)")
        self.fitted = state["fitted"]

    def head_state_dict(self) -> dict[str, Tensor]:
        """State of everything but the encoder (what :meth:`save` writes)."""
        return {k: v for k, v in self.state_dict().items() if not k.startswith("encoder.")}

    def save(self, path: str | os.PathLike) -> None:
        """Write the method name, its options and the non-encoder state to ``path``.

        The encoder's weights are not written; pass the same encoder to :func:`load`. The
        file loads with ``torch.load(..., weights_only=True)`` and is written atomically
        (:func:`bayesurl.files.atomic_open`; missing parent folders are created).

        Raises
        ------
        ValueError
            If ``path`` is a folder or cannot be written.
        """
        path = check_output_file(path, "path")
        state = {
            k: (v.detach().cpu() if isinstance(v, Tensor) else v)
            for k, v in self.head_state_dict().items()
        }
        doc = {"format": FORMAT, "method": self.method, "config": self.config(), "state": state}
        if self.input_shape is not None:
            doc["input_shape"] = list(self.input_shape)
        with atomic_open(path, "wb") as fh:
            torch.save(doc, fh)

    @classmethod
    def load(cls, path: str | os.PathLike, encoder: nn.Module, **options: Any) -> PosthocWrapper:
        """Rebuild a saved wrapper around ``encoder`` (see :func:`load`)."""
        obj = load(path, encoder, **options)
        if cls is not PosthocWrapper and not isinstance(obj, cls):
            raise ValueError(f"`path` holds a {obj.method!r} wrapper, not {cls.method!r}")
        return obj

    @classmethod
    def from_config(
        cls,
        encoder: nn.Module,
        config: dict[str, Any],
        state: dict[str, Tensor],
        input_shape: Sequence[int] | None = None,
    ) -> PosthocWrapper:
        """Rebuild from :meth:`config` and :meth:`head_state_dict` (used by :func:`load`).

        The encoder's output width is read from its type (:func:`known_embedding_dim`) or,
        failing that, from one forward pass of two zero inputs of ``input_shape`` (the item
        shape the wrapper was fitted on); another width than the saved one is refused.
        """
        want = config.get("embed_dim")
        have = known_embedding_dim(encoder)
        if have is None and want is not None and input_shape is not None:
            have = probe_width(encoder, input_shape)
        if have is not None and want is not None and have != want:
            raise ValueError(
                f"saved state does not fit the encoder: it was fitted on {want}-dim "
                f"embeddings, the encoder returns {have}"
            )
        obj = cls(encoder, **config)
        obj._load_head_state(state)
        return obj.to(device_of(encoder))

    def _load_head_state(self, state: dict[str, Tensor]) -> None:
        try:
            missing, unexpected = self.load_state_dict(state, strict=False)
        except RuntimeError as exc:  # shape mismatch
            raise ValueError(
                f"saved state does not fit the {self.method!r} wrapper: {exc}"
            ) from exc
        missing = [k for k in missing if not k.startswith("encoder.")]
        if missing == ["_extra_state"]:  # a checkpoint without it was saved after `fit`
            missing, self.fitted = [], True
        if missing or unexpected:
            raise ValueError(
                f"saved state does not fit the {self.method!r} wrapper: missing {missing}, "
                f"unexpected {unexpected}"
            )


def load(path: str | os.PathLike, encoder: nn.Module, **options: Any) -> PosthocWrapper:
    """Load a wrapper written by :meth:`PosthocWrapper.save` around ``encoder``.

    ``options`` override the saved constructor options; modules that are not saved go here
    (``classifier=`` for a Laplace wrapper fitted on a classifier, or to refit PVU).

    Raises
    ------
    FileNotFoundError
        If ``path`` does not exist.
    ValueError
        If the file is not a bayesurl post-hoc checkpoint, is corrupted, or its state does not
        fit (e.g. another embedding dimension).
    """
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"no such checkpoint: {path}")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise ValueError(load_refusal(path, exc, f"`path` {path!r}")) from exc
    if not isinstance(ckpt, dict) or ckpt.get("format") != FORMAT:
        raise ValueError(f"`path` {path} is not a bayesurl post-hoc checkpoint ({FORMAT})")
    for key in ("method", "config", "state"):
        if key not in ckpt:
            raise ValueError(f"`path` {path} is corrupted: no {key!r} entry")
    encoder = as_encoder(encoder)
    cls = wrapper_class(ckpt["method"])
    if not isinstance(ckpt["config"], dict) or not isinstance(ckpt["state"], dict):
        raise ValueError(f"`path` {path} is corrupted: config / state are not dicts")
    shape = ckpt.get("input_shape")
    if shape is not None and not (
        isinstance(shape, list) and all(isinstance(d, int) and d >= 0 for d in shape)
    ):
        raise ValueError(f"`path` {path} is corrupted: input_shape {shape!r}")
    obj = cls.from_config(encoder, {**ckpt["config"], **options}, ckpt["state"], shape)
    obj.input_shape = None if shape is None else tuple(shape)
    return obj
