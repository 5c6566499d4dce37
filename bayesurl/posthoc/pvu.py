"""Pretrained visual uncertainties (PVU, Kirchhof et al. 2024; thesis chapter 5, section 5.3).

Loss prediction made transferable: an MLP head predicts the (gradient-detached) task loss of
each input from the frozen embedding, behind a StopGrad, trained on cached embeddings
(:class:`~bayesurl.features.store.EmbeddingCache`) with the scale-free ranking loss of Yoo &
Kweon (2019)

``L = max(0, -sign(L1 - L2) (u1 - u2) + m)``, ``m = 0.1`` (PVU eq. 3),

or the squared error ``(u - L_task)^2`` (PVU eq. 2) as an option. The task loss comes from a
classifier on the frozen embedding (cross-entropy), or, for users with labels but no
classifier, from a supervised contrastive task on the batch.
"""

from __future__ import annotations

import math
import os
import tempfile
import time
import warnings
from collections.abc import Callable, Iterable
from enum import Enum
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from bayesurl._checks import (
    check_finite,
    check_floating,
    check_int,
    check_ndim,
    check_number,
    check_same_length,
)
from bayesurl._modules import device_of
from bayesurl.data.batch import iterate, unpack_batch
from bayesurl.features.store import EmbeddingCache
from bayesurl.posthoc.base import (
    PosthocWrapper,
    check_embedding_width,
    known_embedding_dim,
    register_wrapper,
)

__all__ = [
    "PVU",
    "PVUHead",
    "PVULoss",
    "PVUTask",
    "check_head_trainable",
    "classifier_task_loss",
    "mse_loss",
    "ranking_loss",
    "supcon_task_loss",
]


class PVULoss(str, Enum):
    """Objective of the uncertainty head."""

    #: ``max(0, -sign(L1 - L2)(u1 - u2) + m)`` (PVU eq. 3, the default)
    RANKING = "ranking"
    #: ``(u - L)^2`` (PVU eq. 2, plain loss prediction)
    MSE = "mse"


class PVUTask(str, Enum):
    """Where the task loss comes from."""

    #: cross-entropy of a classifier on the frozen embedding
    CLASSIFIER = "classifier"
    #: supervised contrastive loss of each anchor in the batch (labels, no classifier)
    SUPCON = "supcon"
    #: ``classifier`` when one is given, else ``supcon``
    AUTO = "auto"


def _enum(enum: type[Enum], value: Any, name: str) -> Any:
    try:
        return enum(str(getattr(value, "value", value)).lower())
    except ValueError:
        valid = ", ".join(v.value for v in enum)
        raise ValueError(f"unknown `{name}` {value!r}; valid: {valid}") from None


class PVUHead(nn.Module):
    """``Linear(D,512)-LeakyReLU-Linear(512,512)-LeakyReLU-Linear(512,1)-Softplus`` (PVU).

    Default (Kaiming-uniform) initialisation; never zero-initialise it: a zero head outputs a
    constant, so the ranking loss has no gradient and it cannot train (PVU thesis, chapter 5).

    Parameters
    ----------
    in_features : int
        Embedding dimension D.
    hidden : int
        Hidden width (512 in PVU).
    """

    def __init__(self, in_features: int, hidden: int = 512) -> None:
        super().__init__()
        check_int(in_features, "in_features", low=1)
        check_int(hidden, "hidden", low=1)
        self.in_features = int(in_features)
        self.net = nn.Sequential(
            nn.Linear(in_features, hidden),
            nn.LeakyReLU(),
            nn.Linear(hidden, hidden),
            nn.LeakyReLU(),
            nn.Linear(hidden, 1),
            nn.Softplus(),
        )

    def forward(self, embedding: Tensor) -> Tensor:
        """Predicted uncertainty ``u [N] > 0`` of embeddings ``[N, D]``."""
        check_ndim(embedding, "embedding", 2)
        if embedding.shape[1] != self.in_features:
            raise ValueError(
                f"`embedding` has {embedding.shape[1]} features, the head expects "
                f"{self.in_features}"
            )
        return self.net(embedding).squeeze(-1)


def _pairs(n: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """Pair every row i with row (i + n // 2) mod n (Yoo & Kweon's batch halves; odd n too)."""
    i = torch.arange(n, device=device)
    return i, (i + n // 2) % n


def _check_u_and_losses(u: Tensor, task_loss: Tensor) -> None:
    """``u [N]`` finite and ``task_loss [N]`` finite or NaN (NaN: an anchor without a loss)."""
    check_ndim(u, "u", 1)
    check_ndim(task_loss, "task_loss", 1)
    check_same_length(("u", u), ("task_loss", task_loss))
    check_finite(u.detach(), "u")
    if bool(torch.isinf(task_loss).any()):
        raise ValueError("`task_loss` contains inf (NaN marks an anchor without a loss)")


def ranking_loss(u: Tensor, task_loss: Tensor, margin: float = 0.1) -> Tensor:
    """PVU ranking loss ``mean max(0, -sign(L1 - L2)(u1 - u2) + margin)`` (PVU eq. 3).

    Row ``i`` is compared with row ``(i + N // 2) mod N`` (the two batch halves of Yoo &
    Kweon 2019; with odd ``N`` every row takes part). Only the *order* of the task losses
    enters, so the loss is invariant to any strictly increasing transform of them, e.g. scaling.
    Ties (``L1 = L2``) contribute the constant ``margin`` and no gradient. Rows whose task loss
    is NaN (e.g. a SupCon anchor without a positive) are left out of every pair.

    Parameters
    ----------
    u : Tensor
        ``[N]`` predicted uncertainties.
    task_loss : Tensor
        ``[N]`` task losses (detached here: the StopGrad of PVU).
    margin : float
        ``m`` (0.1 in PVU).
    """
    _check_u_and_losses(u, task_loss)
    valid = ~torch.isnan(task_loss)
    u, task = u[valid], task_loss.detach()[valid]
    if u.shape[0] < 2:
        raise ValueError(
            f"the ranking loss needs at least 2 rows with a task loss, got {u.shape[0]}"
        )
    i, j = _pairs(u.shape[0], u.device)
    sign = torch.sign(task[i] - task[j])
    return F.relu(-sign * (u[i] - u[j]) + margin).mean()


def mse_loss(u: Tensor, task_loss: Tensor) -> Tensor:
    """Plain loss prediction ``mean (u - L)^2`` on detached task losses (PVU eq. 2)."""
    _check_u_and_losses(u, task_loss)
    valid = ~torch.isnan(task_loss)
    if not bool(valid.any()):
        raise ValueError("`task_loss` has no finite entry")
    return ((u[valid] - task_loss.detach()[valid]) ** 2).mean()


def classifier_task_loss(classifier: nn.Module, embedding: Tensor, labels: Tensor) -> Tensor:
    """Per-input cross-entropy ``[N]`` of a (frozen) classifier on the embedding (PVU eq. 2)."""
    with torch.no_grad():
        logits = classifier(embedding)
    check_ndim(logits, "classifier output", 2)
    if labels is None:
        raise ValueError("the classifier task needs labels: yield (x, y) batches")
    labels = labels.to(logits.device)
    if bool((labels < 0).any()) or bool((labels >= logits.shape[1]).any()):
        raise ValueError(
            f"`labels` must lie in [0, {logits.shape[1]}) for a {logits.shape[1]}-class classifier"
        )
    return F.cross_entropy(logits, labels, reduction="none")


def supcon_task_loss(embedding: Tensor, labels: Tensor, temperature: float = 0.1) -> Tensor:
    """Per-anchor supervised contrastive loss ``[N]`` (Khosla et al. 2020, L_out).

    ``l_i = -mean_{p in P(i)} log( exp(s_ip / t) / sum_{a != i} exp(s_ia / t) )`` on cosine
    similarities; anchors with no positive in the batch get NaN (no loss is defined for them;
    :func:`ranking_loss` leaves them out of its pairs).
    """
    check_ndim(embedding, "embedding", 2)
    check_floating(embedding, "embedding")
    check_finite(embedding.detach(), "embedding")
    if labels is None:
        raise ValueError("the supervised contrastive task needs labels: yield (x, y) batches")
    check_ndim(labels, "labels", 1)
    check_same_length(("embedding", embedding), ("labels", labels))
    z = F.normalize(embedding.detach(), dim=1)
    n = z.shape[0]
    eye = torch.eye(n, dtype=torch.bool, device=z.device)
    logits = (z @ z.T / temperature).masked_fill(eye, float("-inf"))
    log_prob = logits - torch.logsumexp(logits, dim=1, keepdim=True)
    labels = labels.to(z.device)
    pos = (labels[:, None] == labels[None, :]) & ~eye
    n_pos = pos.sum(1)
    total = torch.where(pos, log_prob, torch.zeros_like(log_prob)).sum(1)
    return torch.where(n_pos > 0, -total / n_pos.clamp_min(1), torch.full_like(total, math.nan))


def check_head_trainable(head: nn.Module, probe: Tensor) -> None:
    """Reject a head that cannot learn, warn about zero-initialised layers.

    The test is the one that matters: one ranking-loss gradient on ``probe`` (task losses
    ``0, 1, ..., N-1``). A head whose parameters all get exactly zero gradient, e.g. an all-zero
    head (constant output and zero hidden activations), never moves (PVU thesis, chapter 5) and
    is rejected. A linear layer with an all-zero weight only warns: it can still recover.

    Raises
    ------
    ValueError
        If no parameter of ``head`` receives a gradient on ``probe``.
    """
    for name, m in head.named_modules():
        if isinstance(m, nn.Linear) and not bool(m.weight.detach().any()):
            warnings.warn(
                f"uncertainty head layer {name!r} is zero-initialised; use the default "
                "initialisation (PVU: zero heads fail to train)",
                stacklevel=3,
            )
    params = [p for p in head.parameters() if p.requires_grad]
    if not params:
        raise ValueError("the uncertainty head has no trainable parameters")
    if probe.shape[0] < 2:
        return
    with torch.enable_grad():
        u = head(probe)
        task = torch.arange(probe.shape[0], dtype=u.dtype, device=u.device)
        grads = torch.autograd.grad(ranking_loss(u, task), params, allow_unused=True)
    if all(g is None or not bool(g.any()) for g in grads):
        raise ValueError(
            "the uncertainty head gets zero gradient from the ranking loss (zero-initialised "
            "or collapsed), so it cannot train; re-initialise the head"
        )


@register_wrapper("pvu", fit_inputs="augmented")
class PVU(PosthocWrapper):
    """Post-hoc pretrained visual uncertainties around a frozen encoder (thesis section 5.3).

    ``u(x) = head(stopgrad(e(x)))``; the embedding is the encoder's, bit for bit.

    Parameters
    ----------
    encoder : nn.Module
        Maps inputs to embeddings ``[N, D]``; frozen.
    classifier : nn.Module, optional
        Maps embeddings to logits; its per-input cross-entropy is the task loss. It is used only
        while fitting and is not saved (set ``wrapped.classifier`` again to refit a loaded one).
    task : {"auto", "classifier", "supcon"}
        Task loss source (``auto``: the classifier if given, else supervised contrastive).
    loss : {"ranking", "mse"}
        Head objective.
    margin : float
        Ranking margin ``m``.
    hidden : int
        Head width.
    embed_dim : int, optional
        D. When omitted it is known only for an ``nn.Linear`` encoder (or a Sequential ending
        in one) and a registry method; otherwise the head is built from the first embeddings
        the encoder returns in :meth:`fit` (never from attributes such as timm's
        ``num_features``, the width before a classifier head).
    temperature : float
        Temperature of the supervised contrastive task.
    """

    def __init__(
        self,
        encoder: nn.Module,
        *,
        classifier: nn.Module | None = None,
        task: str | PVUTask = "auto",
        loss: str | PVULoss = "ranking",
        margin: float = 0.1,
        hidden: int = 512,
        embed_dim: int | None = None,
        temperature: float = 0.1,
    ) -> None:
        super().__init__(encoder)
        self.task = _enum(PVUTask, task, "task")
        if self.task is PVUTask.AUTO:
            self.task = PVUTask.CLASSIFIER if classifier is not None else PVUTask.SUPCON
        self.loss = _enum(PVULoss, loss, "loss")
        if not float(margin) >= 0:
            raise ValueError(f"`margin` must be >= 0, got {margin}")
        self.margin = float(margin)
        self.hidden = int(hidden)
        self.temperature = float(temperature)
        object.__setattr__(self, "classifier", classifier)  # not a submodule: not saved
        if not self.temperature > 0 or not math.isfinite(self.temperature):
            raise ValueError(f"`temperature` must be a positive number, got {temperature}")
        if embed_dim is not None:
            check_int(embed_dim, "embed_dim", low=1)
        dim = embed_dim if embed_dim is not None else known_embedding_dim(encoder)
        self.head: PVUHead | None = None
        if dim is not None:
            self._build_head(int(dim))

    def _build_head(self, dim: int) -> None:
        self.head = PVUHead(dim, self.hidden).to(device_of(self.encoder))

    def config(self) -> dict[str, Any]:
        return {
            "task": self.task.value,
            "loss": self.loss.value,
            "margin": self.margin,
            "hidden": self.hidden,
            "embed_dim": None if self.head is None else self.head.in_features,
            "temperature": self.temperature,
        }

    def _head_dtype(self) -> torch.dtype:
        return next(self.head.parameters()).dtype

    def check_embedding(self, embedding: Tensor) -> None:
        if self.head is not None:
            check_embedding_width(embedding, self.head.in_features, "PVU head")

    def uncertainty_from(self, embedding: Tensor) -> Tensor:
        if self.head is None:
            raise ValueError("the PVU head is not built yet: call `fit` (or pass `embed_dim`)")
        check_embedding_width(embedding, self.head.in_features, "PVU head")
        # the head keeps its dtype; u follows the embedding's (float64 batches work)
        u = self.head(embedding.detach().to(self._head_dtype()))
        return u.to(embedding.dtype) if embedding.is_floating_point() else u

    # -- training -----------------------------------------------------------------------------
    def task_loss(self, embedding: Tensor, labels: Tensor | None) -> Tensor:
        """Detached per-input task loss ``[N]`` of cached or fresh embeddings."""
        if self.task is PVUTask.CLASSIFIER:
            return classifier_task_loss(self.classifier, embedding, labels)
        return supcon_task_loss(embedding, labels, self.temperature)

    def objective(self, u: Tensor, task_loss: Tensor) -> Tensor:
        """Head loss: ranking (default) or MSE."""
        if self.loss is PVULoss.RANKING:
            return ranking_loss(u, task_loss, self.margin)
        return mse_loss(u, task_loss)

    def _step(self, opt: torch.optim.Optimizer, emb: Tensor, labels: Tensor | None) -> float:
        emb = emb.to(self._head_dtype())
        task = self.task_loss(emb, labels)
        if int((~torch.isnan(task)).sum()) < 2:
            return math.nan  # no comparable pair in this batch (e.g. SupCon without positives)
        loss = self.objective(self.head(emb), task)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return float(loss.detach())

    def fit(
        self,
        loader: Iterable[Any] | EmbeddingCache | None = None,
        *,
        cache: EmbeddingCache | str | os.PathLike | None = None,
        cache_dir: str | os.PathLike | None = None,
        cached: bool = True,
        epochs: int = 1,
        batch_size: int = 256,
        lr: float = 1e-3,
        weight_decay: float = 0.0,
        optimizer: Callable[..., torch.optim.Optimizer] | None = None,
        generator: torch.Generator | None = None,
        progress: bool = True,
    ) -> dict[str, Any]:
        """Train the head alone (the encoder stays frozen).

        With ``cached=True`` (default) the encoder runs once per epoch's augmentation pass to
        fill an :class:`EmbeddingCache` (in ``cache_dir``, or a temporary directory removed
        afterwards) and the head is trained from it, one pass per epoch; an existing ``cache``
        (or a cache passed as ``loader``) skips the encoder entirely; it must have been built by
        this wrapper's encoder (its :func:`~bayesurl.features.store.encoder_fingerprint` is
        checked, a mismatch raises ``ValueError``). ``cached=False`` runs the encoder on every
        step (the uncached reference).

        Returns
        -------
        dict
            ``losses`` (mean head loss per epoch), ``cache_seconds``, ``train_seconds``.
        """
        check_int(epochs, "epochs", low=1)
        check_number(lr, "lr", low=0.0, low_open=True)
        check_number(weight_decay, "weight_decay", low=0.0)
        if self.task is PVUTask.CLASSIFIER and self.classifier is None:
            raise ValueError(
                "task='classifier' needs a `classifier` module (wrap(..., classifier=))"
            )
        if isinstance(loader, EmbeddingCache):
            loader, cache = None, loader
        if isinstance(cache, (str, os.PathLike)):
            cache = EmbeddingCache(cache)
        if loader is None and cache is None:
            raise ValueError("pass a `loader` or a `cache`")
        if cache is not None:
            cache.check_encoder(self.encoder)  # a cache of another encoder: refused
        make_opt = optimizer or (lambda p: torch.optim.AdamW(p, lr=lr, weight_decay=weight_decay))
        if not cached and cache is None:
            return self._fit_uncached(loader, int(epochs), make_opt, progress)
        t0 = time.perf_counter()
        tmp = None
        if cache is None:
            if cache_dir is None:
                tmp = tempfile.TemporaryDirectory(prefix="bayesurl-pvu-")
                cache_dir = tmp.name
            cache = EmbeddingCache.build(
                self.encoder,
                loader,
                cache_dir,
                passes=int(epochs),
                progress=progress,
                overwrite=True,
            )
        t_cache = time.perf_counter() - t0
        if cache.input_shape is not None:
            self.input_shape = cache.input_shape
        try:
            out = self._fit_cache(
                cache, int(epochs), int(batch_size), make_opt, generator, progress
            )
        finally:
            if tmp is not None:
                del cache
                tmp.cleanup()
        out["cache_seconds"] = t_cache
        return out

    def _prepare_head(self, probe: Tensor) -> torch.optim.Optimizer:
        if self.head is None:
            self._build_head(int(probe.shape[1]))
        check_embedding_width(probe, self.head.in_features, "PVU head")
        check_head_trainable(self.head, probe.to(self._head_dtype()))
        return self.head.parameters()

    def _fit_cache(self, cache, epochs, batch_size, make_opt, generator, progress):
        if self.task is not PVUTask.CLASSIFIER and not cache.has_labels:
            raise ValueError("the supervised contrastive task needs labels in the cache")
        dev = device_of(self.encoder)
        probe, _ = cache.rows(range(min(cache.n_items, batch_size)))
        opt = make_opt(self._prepare_head(probe.to(dev)))
        self.head.train()
        losses = []
        t0 = time.perf_counter()
        for epoch in range(epochs):
            vals = []
            batches = cache.batches(batch_size, pass_index=epoch, generator=generator)
            for emb, lab in iterate(batches, progress, f"PVU epoch {epoch + 1}/{epochs}"):
                emb = emb.to(dev)
                vals.append(self._step(opt, emb, None if lab is None else lab.to(dev)))
            losses.append(_nanmean(vals))
        self.head.eval()
        self._finish_fit(losses)
        return {"losses": losses, "train_seconds": time.perf_counter() - t0}

    def _fit_uncached(self, loader, epochs, make_opt, progress):
        dev = device_of(self.encoder)
        opt = None
        losses = []
        t0 = time.perf_counter()
        for epoch in range(epochs):
            vals = []
            for batch in iterate(loader, progress, f"PVU epoch {epoch + 1}/{epochs}"):
                x, y = unpack_batch(batch)
                with torch.no_grad():
                    emb = self.embed(x.to(dev))
                check_finite(emb, "encoder output")
                if opt is None:
                    opt = make_opt(self._prepare_head(emb))
                    self.head.train()
                vals.append(self._step(opt, emb, None if y is None else y.to(dev)))
            losses.append(_nanmean(vals))
        if self.head is not None:
            self.head.eval()
        self._finish_fit(losses)
        return {"losses": losses, "train_seconds": time.perf_counter() - t0, "cache_seconds": 0.0}

    def _finish_fit(self, losses: list[float]) -> None:
        """Mark fitted, or raise when no epoch had a single usable step."""
        if self.head is None:
            raise ValueError("`loader` yielded no data: the PVU head was not trained")
        if not any(math.isfinite(v) for v in losses):
            need = (
                "labelled batches with a repeated label (a positive pair) and >= 2 images"
                if self.task is PVUTask.SUPCON
                else "batches of >= 2 labelled images with finite classifier losses"
            )
            raise ValueError(
                f"PVU could not train: no batch gave a finite loss (losses={losses}); the "
                f"{self.task.value!r} task needs {need}"
            )
        self.fitted = True


def _nanmean(vals: list[float]) -> float:
    ok = [v for v in vals if v == v]
    return sum(ok) / len(ok) if ok else math.nan
