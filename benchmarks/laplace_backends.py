"""Curvature backends on a pair loss: what nngeometry, BackPACK and curvlinops give.

A 64 -> 16 last layer on class-clustered ReLU features (``benchmarks/laplace.py``'s
``_clustered_head``), 256 positive pairs, float64, one thread. References are exact dense
GGNs of the same pair loss; errors are relative Frobenius norms and relative errors of the
linearised predictive trace ``tr Cov(u)`` (prior precision 1, 200 inputs, 50 of them OOD).

1. nngeometry (``FIM(..., variant="regression")``) on the normalised Euclidean pair loss
   ``0.5 ||u_a - u_p||^2`` (GGN = sum (J_a - J_p)^T (J_a - J_p)):
   a) ``function(x_a, x_p) = u_a - u_p`` (the layer called twice);
   b) "expand": the two members stacked on the batch axis, ``function(x) = u``.
2. BackPACK and curvlinops on the unnormalised pair ``0.5 ||z_a - z_p||^2`` (their losses are
   MSE / cross-entropy over standard modules, so the normalisation cannot be expressed): the
   pair as a ``[B, 2, F]`` input, the layer, ``Flatten`` and a frozen ``[I, -I]`` layer,
   ``MSELoss(reduction="sum")`` against 0. BackPACK: ``DiagGGNExact``, ``KFLR``, ``KFAC``.
   curvlinops: ``KFACLinearOperator(kfac_approx="expand" | "reduce")`` against its own exact
   ``GGNLinearOperator``.
3. bayesurl ``hessian_structure="kron"`` on loss 1 for comparison.

Run: ``python benchmarks/laplace_backends.py`` (nngeometry: ``pip install nngeometry==0.4``).
"""

from __future__ import annotations

import time
import warnings

import torch
from torch import nn
from torch.func import jacrev

from bayesurl.laplace import MetricLaplace
from bayesurl.laplace.kron import augment, contrastive_blocks, dense_ggn


def _clustered_head(*args):
    """``benchmarks/laplace.py``'s synthetic head (loaded by path: ``laplace`` is a package)."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        "_bench_laplace", Path(__file__).with_name("laplace.py")
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod._clustered_head(*args)


def _rel(m: torch.Tensor, ref: torch.Tensor) -> float:
    return float((m - ref).norm() / ref.norm())


def main() -> int:
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    d, f = 16, 64
    layer, phi, ood, _, pairs = _clustered_head(f, d, 256, 1, torch.float64)
    a, p = pairs[0], pairs[1]
    n = len(a)
    n_params = d * (f + 1)
    idx = torch.arange(n_params).reshape(d, f + 1)
    order = torch.cat([idx[:, :f].reshape(-1), idx[:, f]])  # vector position -> [W | b]
    theta = torch.nn.utils.parameters_to_vector(layer.parameters()).detach()

    def emb(t: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        w, b = t[: d * f].reshape(d, f), t[d * f :]
        return nn.functional.normalize(x @ w.T + b, dim=-1)

    x_test = torch.cat([phi[:150], ood[:50]])
    jt = torch.stack([jacrev(emb)(theta, x) for x in x_test])  # [N, D, P]
    eye = torch.eye(n_params, dtype=torch.float64)

    def trace_err(prec: torch.Tensor, ref: torch.Tensor) -> tuple[float, float, float]:
        tr = torch.einsum("ndp,pq,ndq->n", jt, torch.linalg.inv(prec), jt)
        e = (tr - ref).abs() / ref
        return float(e.median()), float(e.max()), float((tr / ref).median())

    pos = (a, p, a[:0], a[:0])
    blocks = contrastive_blocks(
        layer(phi).detach(), pos, approximation="positive", geometry="euclidean"
    )
    exact_rm = dense_ggn(blocks, augment(phi, True))
    exact = exact_rm[order][:, order]  # parameters_to_vector order
    ref_tr = torch.einsum("ndp,pq,ndq->n", jt, torch.linalg.inv(exact + eye), jt)
    print(
        f"pair loss 0.5 ||u_a - u_p||^2 (normalised, euclidean), last layer {f} -> {d}, "
        f"{n} positive pairs, float64, one thread"
    )
    print(
        f"{'backend / representation':40s} {'ms':>7s} {'Frobenius':>9s} "
        f"{'trace err median / max':>23s} {'trace ratio':>11s}"
    )

    def row(name: str, ms: float, m: torch.Tensor | None) -> None:
        if m is None:
            print(f"{name:40s} {ms:7.1f} {'-':>9s}")
            return
        med, mx, ratio = trace_err(m + eye, ref_tr)
        print(f"{name:40s} {ms:7.1f} {_rel(m, exact):9.3f} {med:11.3f} / {mx:9.3f} {ratio:11.2f}")

    # 3. bayesurl kron (and diag) on the same pairs
    for structure in ("diag", "kron"):
        la = MetricLaplace(
            nn.Sequential(nn.Identity(), layer),
            approximation="positive",
            geometry="euclidean",
            hessian_structure=structure,
        )
        t = time.perf_counter()
        la.fit([(phi, torch.zeros(len(phi)))], miner=lambda e, y: pos, progress=False)
        ms = 1e3 * (time.perf_counter() - t)
        if structure == "diag":
            m = torch.diag(la.hessian.clamp_min(0))
        else:
            q = torch.kron(la._kron.q_g, la._kron.q_a)
            m = (q @ torch.diag(la.hessian.clamp_min(0)) @ q.T)[order][:, order]
        row(f"bayesurl {structure}", ms, m)

    # 1. nngeometry
    try:
        from nngeometry.metrics import FIM
        from nngeometry.object import PMatDense, PMatDiag, PMatEKFAC, PMatKFAC
    except ImportError:
        print("nngeometry not installed (pip install nngeometry==0.4): rows skipped")
    else:
        from torch.utils.data import DataLoader, TensorDataset

        lay32 = layer
        two = DataLoader(TensorDataset(phi[a], phi[p]), batch_size=n)
        stacked = DataLoader(TensorDataset(torch.cat([phi[a], phi[p]])), batch_size=2 * n)

        def diff_fn(xa: torch.Tensor, xp: torch.Tensor) -> torch.Tensor:
            return nn.functional.normalize(lay32(xa), dim=1) - nn.functional.normalize(
                lay32(xp), dim=1
            )

        def one_fn(x: torch.Tensor) -> torch.Tensor:
            return nn.functional.normalize(lay32(x), dim=1)

        for label, loader, fn, count in (
            ("two calls", two, diff_fn, n),
            ("expand", stacked, one_fn, 2 * n),
        ):
            for rep in (PMatDense, PMatDiag, PMatKFAC, PMatEKFAC):
                t = time.perf_counter()
                try:
                    mat = FIM(lay32, loader, rep, variant="regression", function=fn)
                    m = mat.to_torch().double() * count  # nngeometry averages over examples
                except Exception as exc:  # noqa: BLE001 - report what the backend does
                    print(f"nngeometry {label} {rep.__name__}: {type(exc).__name__}: {exc}")
                    continue
                row(f"nngeometry {label} {rep.__name__}", 1e3 * (time.perf_counter() - t), m)

    # 2. BackPACK and curvlinops on the unnormalised pair
    x = torch.stack([phi[a], phi[p]], 1)  # [B, 2, F]
    target = torch.zeros(n, d, dtype=torch.float64)
    print(
        "\npair loss 0.5 ||z_a - z_p||^2 (unnormalised: MSE over [B, 2, F] -> layer -> Flatten"
        " -> frozen [I, -I]); reference: curvlinops GGNLinearOperator"
    )

    def pair_model(lin: nn.Linear) -> nn.Sequential:
        diff = nn.Linear(2 * d, d, bias=False).double()
        with torch.no_grad():
            diff.weight.copy_(torch.cat([torch.eye(d), -torch.eye(d)], 1))
        diff.weight.requires_grad_(False)
        return nn.Sequential(lin, nn.Flatten(), diff)

    try:
        from curvlinops import GGNLinearOperator, KFACLinearOperator
    except ImportError:
        print("curvlinops not installed: rows skipped")
    else:
        lin = nn.Linear(f, d).double()
        lin.load_state_dict(layer.state_dict())
        model = pair_model(lin)
        loss = nn.MSELoss(reduction="sum")
        params = [lin.weight, lin.bias]
        data = [(x, target)]
        ggn = GGNLinearOperator(model, loss, params, data, check_deterministic=False)
        ref = ggn @ eye
        print(
            f"exact GGN: bias block norm {float(ref[d * f :, d * f :].norm()):.3g} (the bias "
            f"cancels in z_a - z_p), total {float(ref.norm()):.4g}"
        )
        for approx in ("expand", "reduce"):
            t = time.perf_counter()
            k = KFACLinearOperator(
                model,
                loss,
                params,
                data,
                check_deterministic=False,
                fisher_type="type-2",
                kfac_approx=approx,
            )
            m = k @ eye
            ms = 1e3 * (time.perf_counter() - t)
            print(
                f"curvlinops KFAC {approx:6s} {ms:7.1f} ms  Frobenius {_rel(m, ref):7.3f}  "
                f"bias block norm {float(m[d * f :, d * f :].norm()):.3g}"
            )
    try:
        from backpack import backpack, extend
        from backpack.extensions import KFAC, KFLR, DiagGGNExact
    except ImportError:
        print("BackPACK not installed: rows skipped")
    else:
        for ext, attr in ((DiagGGNExact(), "diag_ggn_exact"), (KFLR(), "kflr"), (KFAC(), "kfac")):
            lin = nn.Linear(f, d).double()
            lin.load_state_dict(layer.state_dict())
            model = extend(pair_model(lin))
            loss = extend(nn.MSELoss(reduction="sum"))
            try:
                out = loss(model(x), target)
                with backpack(ext):
                    out.backward()
                val = getattr(lin.weight, attr)
                shapes = [tuple(v.shape) for v in (val if isinstance(val, list) else [val])]
                print(f"BackPACK {type(ext).__name__:13s} ok, weight result shapes {shapes}")
            except Exception as exc:  # noqa: BLE001 - report what the backend does
                print(f"BackPACK {type(ext).__name__:13s} {type(exc).__name__}: {exc}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
