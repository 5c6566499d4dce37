"""Post-hoc last-layer Laplace around a trained encoder (LAM section 3; spec METHODS.md).

For an embedding network whose output is its final ``nn.Linear`` (optionally followed by an L2
normalisation), :func:`bayesurl.laplace.MetricLaplace` fits the diagonal contrastive-GGN
posterior of that layer; the wrapper returns the encoder's own output (the posterior mean,
i.e. the MAP last layer) and ``u = 1/kappa`` from the closed-form predictive variance pushed
through the normalisation (no sampling). ``sample(x, n)`` draws normalised embeddings from the
weight posterior (LAM Fig. 2).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

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
        That layer (a submodule name or the module); default: the last ``nn.Linear``.
    approximation, geometry, prior_precision, margin, hessian_scale
        Passed to :func:`bayesurl.laplace.MetricLaplace`.

    Raises
    ------
    ValueError
        If the encoder has no ``nn.Linear`` or its output is not that layer's output (checked
        on every forward pass).
    """

    has_distribution = True

    def __init__(
        self,
        encoder: nn.Module,
        *,
        last_layer: str | nn.Module | None = None,
        approximation: str = "fixed",
        geometry: str = "arccos",
        prior_precision: float = 1.0,
        margin: float = 0.2,
        hessian_scale: float = 1.0,
    ) -> None:
        super().__init__(encoder)
        from bayesurl.laplace import MetricLaplace

        try:
            self.la = MetricLaplace(
                encoder,
                last_layer,
                approximation=approximation,
                geometry=geometry,
                prior_precision=prior_precision,
                margin=margin,
                hessian_scale=hessian_scale,
            )
        except ValueError as exc:
            raise ValueError(
                f"method='laplace' needs an encoder whose output comes from a last nn.Linear "
                f"layer ({exc}); use method='pvu' or 'tau' for other encoders"
            ) from exc
        self._last_layer_name = last_layer if isinstance(last_layer, str) else None
        self.fitted = False

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

        layer = self.la.last_layer
        d, f = layer.out_features, layer.in_features
        var = self.la.posterior_variance  # weight row-major, then bias
        w_var = var[: d * f].reshape(d, f)
        phi = phi.detach().to(w_var.dtype)
        z = F.linear(phi, layer.weight.detach().to(w_var.dtype), None)
        if layer.bias is not None:
            z = z + layer.bias.detach().to(w_var.dtype)
        out_var = (phi * phi) @ w_var.T
        if layer.bias is not None:
            out_var = out_var + var[d * f :]
        norm2 = (z * z).sum(1).clamp_min(torch.finfo(z.dtype).tiny)
        u = z / norm2.sqrt()[:, None]
        trace = (out_var * (1.0 - u * u)).sum(1) / norm2
        kappa = kappa_from_trace(trace, d)
        return 1.0 / kappa, kappa

    def forward(self, x: Tensor) -> PosthocOutput:
        """Encoder embedding (the posterior mean) and ``u = 1/kappa`` (closed form)."""
        e, phi = self._forward_with_features(x)
        u, kappa = self._uncertainty(phi)
        return PosthocOutput(embedding=e, uncertainty=u.to(e.dtype), kappa=kappa.to(e.dtype))

    def sample(self, x: Tensor, n: int, generator: torch.Generator | None = None) -> Tensor:
        """``[n, N, D]`` normalised embeddings under ``n`` last-layer posterior draws."""
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
        """Fit the posterior on labelled batches ``(x, y)`` (LAM eq. 3; prior by evidence).

        Returns
        -------
        dict
            The fit report of :class:`~bayesurl.laplace.MetricLaplace` (pairs used, fraction of
            clamped Hessian entries) and the prior precision.
        """
        self.la.fit(loader, miner, progress=progress)
        if optimize_prior:
            self.la.optimize_prior_precision()
        self.fitted = True
        report = dict(self.la.fit_report[-1])
        report["prior_precision"] = self.la.prior_precision.detach().cpu().tolist()
        return report

    # -- persistence ------------------------------------------------------------------------
    def config(self) -> dict[str, Any]:
        return {
            "last_layer": self._last_layer_name,
            "approximation": self.la.approximation.value,
            "geometry": self.la.geometry.value,
            "margin": self.la.margin,
            "hessian_scale": self.la.hessian_scale,
        }

    def get_extra_state(self) -> dict[str, Any]:
        state = {
            k: (v.detach().cpu() if isinstance(v, Tensor) else v)
            for k, v in self.la.state_dict().items()
        }
        state["fitted"] = self.fitted
        return state

    def set_extra_state(self, state: Any) -> None:
        if not isinstance(state, dict) or "mean" not in state:
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
        self.la.hessian = fn(self.la.hessian)
        self.la.prior_precision = fn(self.la.prior_precision)
        return self
