"""Block-diagonal Kronecker (EKFAC) Laplace over every linear layer of an MLP embedding head.

Beyond the last layer: for a head ``z = f(h)`` made of ``nn.Linear`` layers and
parameter-free activations, layer ``l`` with output ``y_l = W_l x_l + b_l`` enters the
embedding through ``M_t = dz / dy_l`` (from ``torch.func.jacrev``, one ``[D, D_l]`` matrix
per input). The pair GGN block of layer ``l`` is then ``sum_st (M_s^T H_st M_t) (x)
abar_s abar_t^T`` (:mod:`bayesurl.laplace.kron`, :class:`~bayesurl.laplace.kron.DenseBlocks`)
and each layer gets its own nearest-Kronecker factors, eigenbasis and eigen-corrected
curvature; layers are independent a posteriori (block-diagonal GGN, as laplace-torch's
``KronLaplace``). The linearised predictive sums the layers' output covariances,
``Cov(z) = sum_l M_l Q_Gl diag(c_l) Q_Gl^T M_l^T``, and pushes it through the normalisation.

The pulled-back blocks are dense (``P x 3 x D_l^2`` floats for ``P`` pairs): meant for
small heads (a few hundred units), not for a 2,048-wide layer.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call, jacrev, vmap
from torch.nn.utils import parameters_to_vector

from bayesurl._checks import check_finite, check_int, check_labels, match_module_dtype
from bayesurl._modules import eval_mode
from bayesurl.data.batch import unpack_batch
from bayesurl.laplace.curvature import Approximation, Geometry, _enum, split_pairs
from bayesurl.laplace.kron import (
    DenseBlocks,
    KronPosterior,
    augment,
    contrastive_blocks,
    linearised_trace,
)
from bayesurl.laplace.metric import Miner, _evidence_argmax, _progress, kappa_from_trace
from bayesurl.types import Output

__all__ = ["KronHeadLaplace"]


class KronHeadLaplace:
    """Block-diagonal EKFAC posterior over the linear layers of an MLP head (LAM section 3).

    Parameters
    ----------
    model : nn.Module
        The embedding network; its output must be the head's output (the unnormalised
        embedding, or what an L2 normalisation is applied to).
    head : str or nn.Sequential
        The head (name of a submodule or the module): ``nn.Linear`` layers and
        parameter-free elementwise modules, ending in ``nn.Linear``.
    approximation, geometry, margin, hessian_scale
        As in :func:`bayesurl.laplace.MetricLaplace`.
    prior_precision : float
        Scalar prior precision ``lambda`` (the same for every layer).
    """

    def __init__(
        self,
        model: nn.Module,
        head: str | nn.Module,
        *,
        approximation: Approximation | str = "fixed",
        geometry: Geometry | str = "arccos",
        prior_precision: float = 1.0,
        margin: float = 0.2,
        hessian_scale: float = 1.0,
    ) -> None:
        if not isinstance(model, nn.Module):
            raise ValueError(f"`model` must be an nn.Module, got {type(model).__name__}")
        if isinstance(head, str):
            try:
                head = model.get_submodule(head)
            except AttributeError:
                raise ValueError(f"`head`: model has no submodule {head!r}") from None
        if not isinstance(head, nn.Sequential) or not any(m is head for m in model.modules()):
            raise ValueError("`head` must be an nn.Sequential submodule of `model`")
        mods = list(head)
        if not mods or not isinstance(mods[-1], nn.Linear):
            raise ValueError("`head` must end in an nn.Linear (the embedding layer)")
        for m in mods:
            if not isinstance(m, nn.Linear) and any(True for _ in m.parameters()):
                raise ValueError(
                    f"`head` may hold nn.Linear layers and parameter-free modules only, got "
                    f"{type(m).__name__} with parameters"
                )
        if mods[-1].out_features < 2:
            raise ValueError(
                f"`head` ends in out_features={mods[-1].out_features}: the normalised embedding "
                "needs D >= 2 to have a direction to be uncertain about"
            )
        self.model, self.head = model, head
        self.linears = [k for k, m in enumerate(mods) if isinstance(m, nn.Linear)]
        self.approximation = _enum(Approximation, approximation, "approximation")
        self.geometry = _enum(Geometry, geometry, "geometry")
        if not float(margin) > 0:
            raise ValueError(f"`margin` must be positive, got {margin}")
        if not float(hessian_scale) > 0:
            raise ValueError(f"`hessian_scale` must be positive, got {hessian_scale}")
        lam = float(prior_precision)
        if not (math.isfinite(lam) and lam > 0):
            raise ValueError(f"`prior_precision` must be a positive number, got {prior_precision}")
        self.margin, self.hessian_scale, self.prior_precision = (
            float(margin),
            float(hessian_scale),
            lam,
        )
        self.posteriors = [
            KronPosterior(mods[k].out_features, mods[k].in_features, mods[k].bias is not None)
            for k in self.linears
        ]
        w = mods[-1].weight
        self.curvature = [
            torch.zeros(p.d * p.width, dtype=w.dtype, device=w.device) for p in self.posteriors
        ]
        self.kron_max_iter, self.kron_tol = 100, None
        self.n_pairs = 0
        self.fit_report: list[dict[str, Any]] = []

    # ------------------------------------------------------------------ head pieces
    @property
    def n_params(self) -> int:
        return sum(c.numel() for c in self.curvature)

    @property
    def mean(self) -> Tensor:
        """Head parameters ``[P]`` (layer by layer, weight row-major then bias)."""
        return parameters_to_vector(self.head.parameters()).detach()

    @property
    def clamped_fraction(self) -> float:
        """Fraction of the eigen-corrected curvature entries clamped at 0 (all layers)."""
        return float((torch.cat(self.curvature) < 0).double().mean())

    def _variances(self) -> list[Tensor]:
        lam = self.prior_precision
        return [1.0 / (self.hessian_scale * s.clamp_min(0.0) + lam) for s in self.curvature]

    def head_input(self, x: Any) -> Tensor:
        """Input ``h [N, F]`` of the head for a batch ``x`` (one model forward pass)."""
        store: dict[str, Tensor] = {}

        def hook(_m: nn.Module, inputs: tuple[Tensor, ...]) -> None:
            store["h"] = inputs[0]

        if isinstance(x, Tensor):
            check_finite(x, "x")
            x = match_module_dtype(x.to(self.head[-1].weight.device), self.model)
        handle = self.head.register_forward_pre_hook(hook)
        try:
            self.model(x)
        finally:
            handle.remove()
        if "h" not in store:
            raise ValueError("`head` was not called in the model's forward pass")
        return store["h"]

    def _layers(self, h: Tensor) -> tuple[Tensor, list[Tensor], list[Tensor]]:
        """``z``, the input ``x_l`` and the Jacobian ``M_l = dz/dy_l [N, D, D_l]`` per layer."""
        mods = list(self.head)
        inputs, outputs = [], []
        out = h
        for k, m in enumerate(mods):
            if k in self.linears:
                inputs.append(out)
            out = m(out)
            if k in self.linears:
                outputs.append(out)
        jacs = []
        for pos, k in enumerate(self.linears):
            tail = nn.Sequential(*mods[k + 1 :])
            if len(tail) == 0:
                d = out.shape[1]
                eye = torch.eye(d, dtype=out.dtype, device=out.device)
                jacs.append(eye.expand(out.shape[0], d, d))
            else:
                params = dict(tail.named_parameters())

                def f(y: Tensor, tail: nn.Module = tail, params: dict = params) -> Tensor:
                    return functional_call(tail, params, (y[None],))[0]

                jacs.append(vmap(jacrev(f))(outputs[pos].detach()))
        return out.detach(), [t.detach() for t in inputs], jacs

    def _blocks(self, z: Tensor, tup: tuple[Tensor, ...], jacs: list[Tensor]) -> list[DenseBlocks]:
        low = contrastive_blocks(
            z, tup, approximation=self.approximation, geometry=self.geometry, margin=self.margin
        )
        h = low.dense()  # [P, 3, D, D]
        out = []
        for m in jacs:
            mi, mj = m[low.i], m[low.j]
            x = torch.stack(
                [
                    mi.transpose(1, 2) @ h[:, 0] @ mi,
                    mi.transpose(1, 2) @ h[:, 1] @ mj,
                    mj.transpose(1, 2) @ h[:, 2] @ mj,
                ],
                1,
            )
            out.append(DenseBlocks(low.i, low.j, x, low.cross))
        return out

    # ------------------------------------------------------------------ fit
    def fit(
        self, loader: Iterable[Any], miner: Miner | None = None, *, progress: bool = False
    ) -> KronHeadLaplace:
        """Fit every layer's factors and curvature over ``loader`` at the current weights.

        Pairs are mined within each batch on the normalised embeddings (default miner as
        :meth:`bayesurl.laplace.BaseMetricLaplace.fit`); inputs and pulled-back blocks of
        every batch are cached for the ALS.
        """
        if miner is None:
            from pytorch_metric_learning.miners import BatchEasyHardMiner

            miner = BatchEasyHardMiner(pos_strategy="hard", neg_strategy="hard")  # as MetricLaplace
        per_layer: list[list[tuple[Tensor, DenseBlocks]]] = [[] for _ in self.linears]
        offset, n_pairs = 0, 0
        with eval_mode(self.model), torch.no_grad():
            for batch in _progress(loader, progress, "kron head fit"):
                x, y = unpack_batch(batch, labels=True)
                h = self.head_input(x)
                with torch.enable_grad():
                    z, xs, jacs = self._layers(h)
                y = check_labels(y, z.shape[0]).to(z.device)
                tup = miner(F.normalize(z, dim=1), y)
                a1, p, a2, n = split_pairs(tup, z.shape[0])
                blocks = self._blocks(z, (a1, p, a2, n), jacs)
                n_pairs += blocks[0].i.numel()
                for k, (xl, b) in enumerate(zip(xs, blocks)):
                    shifted = DenseBlocks(b.i + offset, b.j + offset, b.x, b.cross)
                    per_layer[k].append((augment(xl, self.posteriors[k].bias), shifted))
                offset += z.shape[0]
        if n_pairs == 0:
            raise ValueError("`miner` returned no pairs with a non-zero Hessian over `loader`")
        iters = []
        for k, post in enumerate(self.posteriors):
            items = per_layer[k]
            blocks = DenseBlocks(
                torch.cat([b.i for _, b in items]),
                torch.cat([b.j for _, b in items]),
                torch.cat([b.x for _, b in items]),
                items[0][1].cross,
            )
            s, info = post.update(
                blocks,  # type: ignore[arg-type]
                torch.cat([a for a, _ in items]),
                max_iter=self.kron_max_iter,
                tol=self.kron_tol,
            )
            check_finite(s, "hessian")
            self.curvature[k] = s
            iters.append(info.get("n_iter"))
        self.n_pairs = n_pairs
        self.fit_report.append(
            {
                "mode": "posthoc",
                "n_pairs": n_pairs,
                "clamped_fraction": self.clamped_fraction,
                "als_iterations": iters,
            }
        )
        return self

    # ------------------------------------------------------------------ prior / evidence
    def log_marginal_likelihood(self, prior_precision: float | None = None) -> Tensor:
        """``-0.5 lam |theta|^2 + 0.5 P log lam - 0.5 sum log(beta relu(S) + lam)``."""
        lam = self.prior_precision if prior_precision is None else float(prior_precision)
        h = self.hessian_scale * torch.cat(self.curvature).clamp_min(0.0)
        theta2 = (self.mean**2).sum()
        return 0.5 * (-lam * theta2 + self.n_params * math.log(lam) - (h + lam).log().sum())

    def optimize_prior_precision(
        self, bounds: tuple[float, float] = (1e-8, 1e8), n_iter: int = 200
    ) -> float:
        """Scalar prior precision maximising :meth:`log_marginal_likelihood` (bisection)."""
        h = (self.hessian_scale * torch.cat(self.curvature).clamp_min(0.0)).double()
        theta2 = float((self.mean.double() ** 2).sum())
        best = _evidence_argmax(h, theta2, bounds, n_iter, self.clamped_fraction)
        self.prior_precision = best
        return best

    # ------------------------------------------------------------------ prediction
    def _closed_form(self, h: Tensor, full: bool = False) -> tuple[Tensor, ...]:
        with torch.enable_grad():
            z, xs, jacs = self._layers(h)
        rs, cs = [], []
        for post, var, xl, m in zip(self.posteriors, self._variances(), xs, jacs):
            q_g = post.basis(var)[0]
            rs.append(m @ q_g)
            cs.append(post.output_variances(xl, var))
        return linearised_trace(z, torch.cat(rs, 2), torch.cat(cs, 1), full=full)

    def predictive(self, x: Any) -> Output:
        """Mean embedding and ``u = 1/kappa`` from the linearised predictive trace."""
        with eval_mode(self.model), torch.no_grad():
            u, trace = self._closed_form(self.head_input(x))
        kappa = kappa_from_trace(trace, u.shape[1])
        return Output(embedding=u, uncertainty=1.0 / kappa, kappa=kappa)

    def predictive_covariance(self, x: Any) -> tuple[Tensor, Tensor]:
        """``u [N, D]`` and the linearised ``Cov(u) [N, D, D]`` (block-diagonal posterior)."""
        with eval_mode(self.model), torch.no_grad():
            u, _, cov = self._closed_form(self.head_input(x), full=True)
        return u, cov

    def sample(self, n: int, generator: torch.Generator | None = None) -> Tensor:
        """``n`` draws of the head's parameter vector, ``[n, P]`` (layers independent)."""
        check_int(n, "n", low=1)
        parts = []
        for post, var in zip(self.posteriors, self._variances()):
            eps = torch.randn(
                (int(n), var.numel()), generator=generator, dtype=var.dtype, device=var.device
            )
            parts.append(post.to_params(eps * var.sqrt()))
        return self.mean + torch.cat(parts, 1)

    # ------------------------------------------------------------------ persistence
    def state_dict(self) -> dict[str, Any]:
        """Per-layer curvature, factors and eigenvectors, prior, mean and options."""
        state: dict[str, Any] = {
            "mean": self.mean.clone(),
            "prior_precision": self.prior_precision,
            "approximation": self.approximation.value,
            "geometry": self.geometry.value,
            "margin": self.margin,
            "hessian_scale": self.hessian_scale,
            "n_pairs": self.n_pairs,
            "n_layers": len(self.posteriors),
        }
        for k, (post, s) in enumerate(zip(self.posteriors, self.curvature)):
            state[f"layer{k}.curvature"] = s.clone()
            for key, t in post.state_dict(s).items():
                state[f"layer{k}.{key}"] = t.clone()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output for the same head (its mean must match).

        Raises
        ------
        ValueError
            On missing keys, another head (layer count, shapes or mean) or non-finite values.
        """
        if not isinstance(state, dict) or "mean" not in state or "n_layers" not in state:
            raise ValueError("`state` is not a KronHeadLaplace state dict")
        if int(state["n_layers"]) != len(self.posteriors):
            raise ValueError(
                f"`state` has {state['n_layers']} layers, the head has {len(self.posteriors)}"
            )
        mean = torch.as_tensor(state["mean"])
        if mean.shape != self.mean.shape or not torch.equal(mean.to(self.mean), self.mean):
            raise ValueError("`state` belongs to another head: its mean differs")
        w = self.head[-1].weight
        curvature = []
        for k, post in enumerate(self.posteriors):
            key = f"layer{k}.curvature"
            if key not in state:
                raise ValueError(f"`state` has no {key!r}")
            s = torch.as_tensor(state[key]).to(dtype=w.dtype, device=w.device)
            if s.numel() != post.d * post.width:
                raise ValueError(f"`state['{key}']` has {s.numel()} entries")
            check_finite(s, key)
            post.load_state_dict(
                {k2.split(".", 1)[1]: v for k2, v in state.items() if k2.startswith(f"layer{k}.")},
                w.dtype,
                w.device,
            )
            curvature.append(s.clone())
        self.curvature = curvature
        self.approximation = _enum(Approximation, state["approximation"], "approximation")
        self.geometry = _enum(Geometry, state["geometry"], "geometry")
        self.margin = float(state["margin"])
        self.hessian_scale = float(state["hessian_scale"])
        self.prior_precision = float(state["prior_precision"])
        self.n_pairs = int(state.get("n_pairs", 0))
