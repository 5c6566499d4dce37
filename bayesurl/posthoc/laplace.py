"""Post-hoc last-layer Laplace around a trained encoder (LAM section 3; docs/concepts/laplace.rst).

Two paths, both through :mod:`bayesurl.laplace` (no Laplace fitting is re-implemented here):

- **Embedding network** (no ``classifier``): for an encoder whose output is its final
  ``nn.Linear`` (optionally followed by an L2 normalisation),
  :func:`bayesurl.laplace.MetricLaplace` fits the diagonal contrastive-GGN posterior of that
  layer; the wrapper returns the encoder's own output (the posterior mean, i.e. the MAP last
  layer) and ``u = 1/kappa`` from the closed-form predictive variance pushed through the
  normalisation (no sampling). ``sample(x, n)`` draws normalised embeddings from the weight
  posterior (LAM Fig. 2).
- **Classifier** (``classifier=`` a head on the embedding): laplace-torch's last-layer Laplace
  of the classifier, fitted by :class:`bayesurl.laplace.ClassifierLaplace` on the frozen
  embeddings, with its closed-form predictive; ``u`` = predictive entropy and ``logits`` = the
  MAP logits. The embedding is untouched (the posterior covers the classifier only).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from bayesurl.data.batch import unpack_batch
from bayesurl.posthoc.base import PosthocOutput, PosthocWrapper, register_wrapper

__all__ = ["LaplaceWrapper"]


@register_wrapper("laplace")
class LaplaceWrapper(PosthocWrapper):
    """A frozen encoder plus a last-layer Laplace posterior (LAM section 3, eq. 3).

    Parameters
    ----------
    encoder : nn.Module
        An embedding network whose output is produced by its last ``nn.Linear`` (or the L2
        normalisation of it).
    last_layer : str or nn.Linear, optional
        That layer (a submodule name or the module). Default: the last ``nn.Linear`` whose
        output equals the encoder's output on the first fitting batch (so the projection of a
        vMF method is found, not its later kappa head).
    approximation, geometry, prior_precision, margin, hessian_scale, hessian_pairs, hessian_miner
        Passed to :func:`bayesurl.laplace.MetricLaplace` (``prior_precision`` also to
        :class:`~bayesurl.laplace.ClassifierLaplace`). The defaults, ``"positive"`` pairs in
        the ``"euclidean"`` geometry (LAM eq. 7), give a psd GGN for any encoder. On an
        encoder trained with cross-entropy (FashionMNIST, ``benchmarks/posthoc.py``) the
        ``"fixed"`` and the arccos ``"positive"`` diagonals were clamped to zero in every
        entry, leaving the posterior equal to the prior. Choose ``"fixed"`` / ``"full"`` and
        ``"arccos"`` for contrastively trained encoders (LAM's setting). The pair set keeps
        ``hessian_miner="hard"`` / ``hessian_pairs="inside_margin"`` here, not
        :func:`~bayesurl.laplace.MetricLaplace`'s LAM-code triplets: with the ``positive``
        approximation only the positives enter, the triplets weight each by its number of
        violating negatives, and on ``bayesurl folder``'s two labelled folders that lowered
        R-AUROC (0.321 -> 0.305, 0.380 -> 0.342; docs/concepts/laplace.rst, "Which pairs enter
        the Hessian").
    classifier : nn.Module, optional
        A classification head on the embedding (ending in ``nn.Linear``); selects the
        classifier path. It is needed again to :func:`~bayesurl.posthoc.load` the wrapper.
    hessian_structure : {"diag", "kron"}
        Posterior structure. Embedding path: :func:`bayesurl.laplace.MetricLaplace`'s
        (``"kron"``: Kronecker-factored EKFAC contrastive GGN, :mod:`bayesurl.laplace.kron`).
        Classifier path: laplace-torch's.
    backend : str
        laplace-torch curvature backend of the classifier path (BackPACK).

    Raises
    ------
    ValueError
        If the encoder has no ``nn.Linear`` or its output is not that layer's output (checked
        on every forward pass).
    """

    def __init__(
        self,
        encoder: nn.Module,
        *,
        last_layer: str | nn.Module | None = None,
        approximation: str = "positive",
        geometry: str = "euclidean",
        prior_precision: float = 1.0,
        margin: float = 0.2,
        hessian_scale: float = 1.0,
        hessian_pairs: str = "inside_margin",
        hessian_miner: str = "hard",
        classifier: nn.Module | None = None,
        hessian_structure: str = "diag",
        backend: str = "backpack",
    ) -> None:
        super().__init__(encoder)
        from bayesurl.laplace import ClassifierLaplace, MetricLaplace

        self.fitted = False
        self._last_layer_name = last_layer if isinstance(last_layer, str) else None
        self._auto_layer = last_layer is None
        self._laplace_options = {
            "approximation": approximation,
            "geometry": geometry,
            "prior_precision": prior_precision,
            "margin": margin,
            "hessian_scale": hessian_scale,
            "hessian_structure": hessian_structure,
            "hessian_pairs": hessian_pairs,
            "hessian_miner": hessian_miner,
        }
        self.cla = None
        if classifier is not None:
            if not isinstance(classifier, nn.Module):
                raise TypeError(
                    f"`classifier` must be an nn.Module, got {type(classifier).__name__}"
                )
            self.classifier = classifier
            try:
                # laplace-torch refuses a one-module model (a bare nn.Linear head): give it
                # a trivial container; the posterior is the same last layer's
                self.cla = ClassifierLaplace(
                    nn.Sequential(nn.Identity(), classifier),
                    hessian_structure=hessian_structure,
                    backend=backend,
                    prior_precision=prior_precision,
                )
            except ValueError as exc:
                raise ValueError(f"method='laplace' with a `classifier`: {exc}") from exc
            self._hessian_structure = self.cla.hessian_structure
            self._backend = str(backend)
            self.la = None
            return
        try:
            self.la = MetricLaplace(encoder, last_layer, **self._laplace_options)
        except ValueError as exc:
            if "hessian_structure" in str(exc):
                raise
            raise ValueError(
                f"method='laplace' needs an encoder whose output comes from a last nn.Linear "
                f"layer ({exc}); use method='pvu' or 'tau' for other encoders"
            ) from exc

    def _pick_last_layer(self, x: Tensor) -> None:
        """With no ``last_layer`` given: use the last ``nn.Linear`` whose output *is* the
        embedding (e.g. the projection of a vMF method, not its kappa head)."""
        from bayesurl.laplace import MetricLaplace

        outs: dict[str, Tensor] = {}
        handles = []
        for name, m in self.encoder.named_modules():
            if isinstance(m, nn.Linear):

                def hook(_m, _i, out, name=name):
                    outs[name] = out

                handles.append(m.register_forward_hook(hook))
        try:
            with torch.no_grad():
                e = self.embed(x)
        finally:
            for h in handles:
                h.remove()
        match = [
            n
            for n, z in outs.items()
            if z.shape == e.shape
            and (
                torch.equal(z, e) or torch.allclose(F.normalize(z, dim=1), e, rtol=1e-5, atol=1e-6)
            )
        ]
        if match and self.encoder.get_submodule(match[-1]) is not self.la.last_layer:
            self.la = MetricLaplace(self.encoder, match[-1], **self._laplace_options)
            self._last_layer_name = match[-1]
        self._auto_layer = False

    @property
    def has_distribution(self) -> bool:  # type: ignore[override]
        """Embedding samples exist on the embedding-network path only."""
        return self.cla is None

    # -- forward ----------------------------------------------------------------------------
    def _forward_with_features(self, x: Tensor) -> tuple[Tensor, Tensor]:
        store: dict[str, Tensor] = {}
        layer = self.la.last_layer

        def pre(_m: nn.Module, inputs: tuple[Tensor, ...]) -> None:
            store["phi"] = inputs[0]

        def post(_m: nn.Module, _i: tuple[Tensor, ...], out: Tensor) -> None:
            store["z"] = out

        h1 = layer.register_forward_pre_hook(pre)
        h2 = layer.register_forward_hook(post)
        try:
            e = self.embed(x)
        finally:
            h1.remove()
            h2.remove()
        if "z" not in store:
            raise ValueError("the Laplace last layer was not called in the encoder's forward pass")
        z = store["z"]
        if z.shape != e.shape or not (
            torch.equal(z, e) or torch.allclose(F.normalize(z, dim=1), e, rtol=1e-5, atol=1e-6)
        ):
            raise ValueError(
                "method='laplace': the encoder's output is not the output of its last nn.Linear "
                f"(layer output {tuple(z.shape)}, encoder output {tuple(e.shape)}); pass "
                "`last_layer=` or use method='pvu' / 'tau'"
            )
        return e, store["phi"]

    def _uncertainty(self, phi: Tensor) -> tuple[Tensor, Tensor]:
        """``(u, kappa)`` in closed form from last-layer inputs ``phi`` (LAM section 3)."""
        from bayesurl.laplace import kappa_from_trace

        with torch.no_grad():
            _, trace = self.la._closed_form(phi.detach())
        kappa = kappa_from_trace(trace, self.la.last_layer.out_features)
        return 1.0 / kappa, kappa

    def forward(self, x: Tensor) -> PosthocOutput:
        """Encoder embedding (the posterior mean) and u in closed form (module docstring)."""
        if self.cla is not None:
            e = self.embed(x)
            if not self.fitted:
                raise ValueError("call `fit(loader)` before predicting with method='laplace'")
            p = self.cla.predictive(e.detach())
            return PosthocOutput(
                embedding=e, uncertainty=p.entropy.to(e.dtype), logits=p.logits.to(e.dtype)
            )
        e, phi = self._forward_with_features(x)
        self.check_fitted()  # else u would be the prior's alone
        u, kappa = self._uncertainty(phi)
        return PosthocOutput(embedding=e, uncertainty=u.to(e.dtype), kappa=kappa.to(e.dtype))

    def sample(self, x: Tensor, n: int, generator: torch.Generator | None = None) -> Tensor:
        """``[n, N, D]`` normalised embeddings under ``n`` last-layer posterior draws."""
        if self.cla is not None:
            raise ValueError(
                "the classifier Laplace posterior is over logits, not embeddings; `sample` "
                "needs the embedding-network path (no `classifier`)"
            )
        self.check_fitted()
        return self.la.predictive_samples(x, int(n), generator)

    # -- fitting ----------------------------------------------------------------------------
    def fit(
        self,
        loader: Iterable[Any],
        *,
        miner: Callable[[Tensor, Tensor], tuple[Tensor, ...]] | None = None,
        optimize_prior: bool = True,
        progress: bool = True,
    ) -> dict[str, Any]:
        """Fit the posterior on labelled batches ``(x, y)``; prior precision by evidence.

        Embedding path: :meth:`bayesurl.laplace.BaseMetricLaplace.fit` (LAM eq. 3) with ``miner``.
        Classifier path: the frozen embeddings of ``loader`` are computed once (held in memory,
        ``N x D``) and laplace-torch fits the classifier's last layer on them.

        Returns
        -------
        dict
            The fit report of :class:`~bayesurl.laplace.MetricLaplace` (pairs used, fraction of
            clamped Hessian entries), or ``n_data`` for the classifier path, and the prior
            precision.
        """
        if self.cla is not None:
            return self._fit_classifier(loader, optimize_prior, progress)
        if iter(loader) is not loader:  # re-iterable: check the layer on one batch first
            from bayesurl._modules import device_of

            for batch in loader:
                x, _ = unpack_batch(batch)
                if isinstance(x, Tensor):
                    x = x.to(device_of(self.encoder))
                    if self._auto_layer:
                        self._pick_last_layer(x)
                    with torch.no_grad():
                        self._forward_with_features(x)
                break
        self.la.fit(loader, miner, progress=progress)
        if optimize_prior:
            self.la.optimize_prior_precision()
        self.fitted = True
        report = dict(self.la.fit_report[-1])
        report["prior_precision"] = self.la.prior_precision.detach().cpu().tolist()
        return report

    def _fit_classifier(self, loader, optimize_prior: bool, progress: bool) -> dict[str, Any]:
        from torch.utils.data import DataLoader, TensorDataset

        from bayesurl._modules import device_of
        from bayesurl.data.batch import iterate

        dev = device_of(self.encoder)
        embs, labels, batch = [], [], 1
        with torch.no_grad():
            for b in iterate(loader, progress, "embedding for Laplace"):
                x, y = unpack_batch(b)
                if y is None or not isinstance(x, Tensor):
                    raise ValueError("method='laplace' fits on labelled batches (x, y)")
                embs.append(self.embed(x.to(dev)).detach())
                labels.append(y.to(dev))
                batch = max(batch, len(y))
        if not embs:
            raise ValueError("`loader` yielded no data")
        data = TensorDataset(torch.cat(embs), torch.cat(labels))
        self.cla.fit(DataLoader(data, batch_size=batch), progress=progress)
        if optimize_prior:
            self.cla.optimize_prior_precision()
        self.fitted = True
        prior = self.cla.la.prior_precision
        return {
            "n_data": len(data),
            "prior_precision": prior.detach().cpu().tolist()
            if isinstance(prior, Tensor)
            else prior,
        }

    # -- persistence ------------------------------------------------------------------------
    def config(self) -> dict[str, Any]:
        if self.cla is not None:
            return {
                "classifier": True,
                "hessian_structure": self._hessian_structure,
                "backend": self._backend,
            }
        return {
            "last_layer": self._last_layer_name,
            "approximation": self.la.approximation.value,
            "geometry": self.la.geometry.value,
            "margin": self.la.margin,
            "hessian_scale": self.la.hessian_scale,
            "hessian_structure": self.la.hessian_structure.value,
            "hessian_pairs": self.la.hessian_pairs.value,
            "hessian_miner": self.la.hessian_miner.value,
        }

    @classmethod
    def from_config(cls, encoder, config, state, input_shape=None):  # type: ignore[override]
        if config.get("classifier") is True:
            raise ValueError(
                "this Laplace wrapper was fitted on a classifier, which is not saved: pass it "
                "again, load(path, encoder, classifier=clf)"
            )
        return super().from_config(encoder, config, state, input_shape)

    def get_extra_state(self) -> dict[str, Any]:
        if self.cla is not None:
            if not self.fitted:
                return {"path": "classifier", "fitted": False}
            raw = self.cla.state_dict()
            state = {k: _plain(v) for k, v in raw.items()}
            return {"path": "classifier", "fitted": True, "laplace": state}
        state = {
            k: (v.detach().cpu() if isinstance(v, Tensor) else v)
            for k, v in self.la.state_dict().items()
        }
        state["fitted"] = self.fitted
        return state

    def set_extra_state(self, state: Any) -> None:
        if not isinstance(state, dict):
            raise ValueError("saved Laplace state is corrupted")
        if (state.get("path") == "classifier") != (self.cla is not None):
            raise ValueError(
                "saved Laplace state and wrapper disagree on the classifier path: pass "
                "`classifier=` exactly when the saved wrapper had one"
            )
        if self.cla is not None:
            if state.get("fitted"):
                lstate = state["laplace"]
                mean = torch.as_tensor(lstate["mean"])
                linears = [m for m in self.classifier.modules() if isinstance(m, nn.Linear)]
                current = torch.nn.utils.parameters_to_vector(linears[-1].parameters()).detach()
                if mean.shape != current.shape or not torch.equal(mean.to(current), current):
                    raise ValueError(
                        "the saved Laplace posterior belongs to another classifier: its mean "
                        "differs from this classifier's last layer"
                    )
                self.cla.load_state_dict(dict(lstate))
            self.fitted = bool(state.get("fitted"))
            return
        if "mean" not in state:
            raise ValueError("saved Laplace state is corrupted (no posterior mean)")
        mean = torch.as_tensor(state["mean"])
        current = self.la.mean
        if mean.shape != current.shape or not torch.equal(mean.to(current), current):
            raise ValueError(
                "the saved Laplace posterior belongs to another encoder: its mean differs from "
                "this encoder's last layer"
            )
        fitted = bool(state.get("fitted", True))
        self.la.load_state_dict({k: v for k, v in state.items() if k != "fitted"})
        self.fitted = fitted

    def _apply(self, fn: Callable[[Tensor], Tensor], recurse: bool = True) -> LaplaceWrapper:
        # the posterior lives outside the module tree: move / cast it with the encoder
        super()._apply(fn, recurse)
        if self.la is None:
            return self
        self.la.apply(fn)
        return self


def _plain(v: Any) -> Any:
    """laplace-torch state entries as weights_only-loadable values (str enums -> str)."""
    if isinstance(v, Tensor):
        return v.detach().cpu()
    if isinstance(v, str):
        return str(v.value) if hasattr(v, "value") else str(v)
    if isinstance(v, (list, tuple)):
        return [_plain(t) for t in v]
    return v
