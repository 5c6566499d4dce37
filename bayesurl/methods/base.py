"""The contract every method follows, and the registry that names them.

A method is an :class:`torch.nn.Module` made of a backbone (any module mapping images to
features ``[N, F]``, or a timm model name), optional heads, a training loss and the definition
of u(x) (docs/concepts/uncertainty.rst, "Where u(x) comes from"). The training loop
(:mod:`bayesurl.training`) only talks to this contract:

- ``forward(x, n_samples=0) -> Output``: embedding, uncertainty, logits where the method has a
  classifier, and ``samples [S, N, D]`` when ``n_samples > 0`` and the method defines a
  distribution.
- ``training_loss(batch) -> Tensor``: a scalar loss for one batch ``(x, y)``; for two-view
  methods (``two_view = True``) ``x`` is a pair ``(x1, x2)`` of augmented views.
- ``on_epoch_start(epoch)`` / ``on_epoch_end(epoch)``: hooks (SNGP resets and accumulates its
  covariance there).
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from collections.abc import Callable
from typing import Any, ClassVar

from torch import Tensor, nn

from bayesurl.backbones import resolve_backbone
from bayesurl.registry import Registry
from bayesurl.types import Output

__all__ = [
    "METHODS",
    "Method",
    "available",
    "constructor_options",
    "create",
    "get",
    "register",
    "resolve_backbone",
]


class Method(nn.Module):
    """Base class of the URL methods (see module docstring for the contract)."""

    #: registry name, set by :func:`register`
    name: ClassVar[str] = ""
    #: the training loop feeds two augmented views ``(x1, x2)`` instead of one image
    two_view: ClassVar[bool] = False
    #: the method needs class labels for training
    supervised: ClassVar[bool] = True
    #: the method can return ``samples [S, N, D]`` from ``forward(x, n_samples=S)``
    has_distribution: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        _spell_out_signature(cls)

    def forward(self, x: Tensor, n_samples: int = 0) -> Output:  # pragma: no cover - abstract
        raise NotImplementedError

    def training_loss(self, batch: tuple[Any, Tensor]) -> Tensor:  # pragma: no cover
        raise NotImplementedError

    def untrained_loss(self) -> float | None:
        """The training loss of a model that has learned nothing, where the loss fixes one.

        ``None`` here (a contrastive or vMF loss has no value that holds for every data set);
        the softmax classifiers return ``ln C``, the cross-entropy of a uniform prediction.
        :mod:`bayesurl.evaluation.notes` compares the last training loss with it.
        """
        return None

    def on_epoch_start(self, epoch: int) -> None:
        """Called by the training loop before each epoch (default: nothing)."""

    def on_epoch_end(self, epoch: int) -> None:
        """Called by the training loop after each epoch (default: nothing)."""


def _spell_out_signature(cls: type) -> None:
    """Give ``cls.__init__`` the full signature of what its ``**options`` pass to the base.

    A method declares its own keywords and hands the shared ones (``embed_dim``,
    ``num_classes``, ...) to its base through ``**options``; ``help()``, IDEs and the docs
    read this signature, so every keyword the constructor takes is listed with its type and
    default (the method's own default where it overrides the base's), keyword-only after the
    method's own positional parameters.
    """
    init = vars(cls).get("__init__")
    if init is None:
        return
    signature = inspect.signature(init)
    own = list(signature.parameters.values())
    if not any(p.kind is p.VAR_KEYWORD for p in own):
        return
    base = next(k for k in cls.__mro__[1:] if "__init__" in vars(k))
    positional = [p for p in own if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    taken = {p.name for p in positional}
    mine = {p.name: p for p in own if p.kind is p.KEYWORD_ONLY}
    inherited, rest = [], []
    for p in list(inspect.signature(base.__init__).parameters.values())[1:]:
        if p.name in taken or p.kind is p.VAR_POSITIONAL:
            continue
        if p.kind is p.VAR_KEYWORD:
            rest.append(p)
            continue
        inherited.append(mine.pop(p.name, p).replace(kind=p.KEYWORD_ONLY))
    params = [*positional, *inherited, *mine.values(), *rest]
    init.__signature__ = signature.replace(parameters=params)


def _load_all() -> None:
    """Import every method module of :mod:`bayesurl.methods`, whose decorators register them."""
    import bayesurl.methods as pkg

    for info in pkgutil.iter_modules(pkg.__path__):
        if not info.name.startswith("_") and info.name != "base":
            importlib.import_module(f"bayesurl.methods.{info.name}")


#: The method classes by name (case-insensitive), filled by :func:`register` on first lookup.
METHODS: Registry[type[Method]] = Registry(
    "method", normalise=lambda s: str(s).lower(), load=_load_all
)


def register(name: str, **traits: Any) -> Callable[[type[Method]], type[Method]]:
    """Class decorator adding a :class:`Method` subclass to :data:`METHODS` under ``name``.

    Raises
    ------
    ValueError
        If ``name`` is taken by another class.
    """

    def deco(cls: type[Method]) -> type[Method]:
        entry = METHODS.add(name, cls, **traits)
        cls.name = entry.name
        return cls

    return deco


def available() -> list[str]:
    """Names of every registered method, sorted."""
    return sorted(METHODS.names())


def get(name: str) -> type[Method]:
    """The method class registered under ``name`` (case-insensitive).

    Raises
    ------
    ValueError
        If ``name`` is unknown; the message lists the valid names.
    """
    return METHODS.get(name)


def constructor_options(cls: type) -> list[str]:
    """Keyword names accepted along the ``__init__`` chain of ``cls`` (``**kwargs`` followed)."""
    names: list[str] = []
    for klass in cls.__mro__:
        init = vars(klass).get("__init__")
        if init is None:
            continue
        params = inspect.signature(init).parameters.values()
        names += [
            p.name
            for p in params
            if p.name != "self" and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)
            and p.name not in names
        ]  # fmt: skip
        if not any(p.kind is p.VAR_KEYWORD for p in params):
            break
    return names


def create(name: str, **kwargs: Any) -> Method:
    """Instantiate the method ``name`` with ``kwargs`` (backbone, embed_dim, num_classes, ...).

    Raises
    ------
    ValueError
        For an unknown ``name`` or an option the method does not take (the message lists the
        valid names, so a ``--method-arg`` typo is one clear line, not a TypeError traceback).
    """
    cls = get(name)
    valid = constructor_options(cls)
    unknown = sorted(set(kwargs) - set(valid))
    if unknown:
        raise ValueError(
            f"unknown option(s) {unknown} for method {cls.name or name!r}; valid: "
            f"{', '.join(valid)}"
        )
    return cls(**kwargs)
