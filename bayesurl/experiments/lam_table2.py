"""LAM Table 2 (closed set, FashionMNIST) re-run with bayesurl's pieces.

Warburg, Jørgensen, Civera & Hauberg (2023), "Bayesian Metric Learning for Uncertainty
Quantification in Image Retrieval" (LAM), section 5 "Closed-set retrieval" and Table 2:
train on all ten FashionMNIST classes (60k train / 10k test), retrieve within the test set,
a small ReLU conv net followed by one linear layer (the Laplace layer, diagonal Hessian),
contrastive loss with margin 0.7 on L2-normalised 3-d embeddings (the authors' FashionMNIST
configs: ``latent_dim 3``, ``margin 0.7``, ``lr 1e-3``). OOD set: the paper uses MNIST, which
is not available offline here; the scikit-learn digits (1,797 images) upsampled to 28 x 28
stand in for it.

Rows: deterministic, MC dropout, deep ensemble, HIB, LAM post-hoc, LAM online, and (opt-in)
``lam_posthoc_kron`` / ``lam_online_kron``: the same two LAM rows with the Kronecker-factored
(EKFAC) posterior of :mod:`bayesurl.laplace.kron` instead of the diagonal
(``hessian_structure="kron"``; ``Table2Config.hessian_structure`` sets the structure of the
plain LAM rows, default ``"diag"``), and (opt-in) ``deep_ensemble_aligned``: the deep ensemble
with each member rotated onto the first member's embedding frame (orthogonal Procrustes on
the training embeddings; a diagnostic, not in LAM or its code). Post-hoc
LAM is fitted on the deterministic model of the same seed; online LAM resumes from it (as the
authors' configs do, ``resume: deterministic/best.ckpt``); the deep ensemble's first member
is the same deterministic model. Each (row, seed) writes one JSON (skipped when present), so
a run can be stopped and resumed; :func:`summarize` turns them into a markdown / CSV table.
:func:`posthoc_sweep` varies the post-hoc posterior of one seed (Hessian-pair miner,
``hessian_scale``, prior precision) on the cached deterministic model.

Columns: bayesurl's :func:`~bayesurl.evaluation.evaluate` (``map@1/5/10``, ``ood_auroc``,
``ood_auprc``, ``ausc``, ``ece``) and the LAM-code variants of
:mod:`bayesurl.evaluation.lam_reference` (``lam_ausc``, ``lam_ece``, ``lam_ood_auroc``,
``lam_ood_auprc``).
"""

from __future__ import annotations

import copy
import json
import logging
import math
import statistics
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from bayesurl.files import atomic_open, atomic_write, write_json

_log = logging.getLogger(__name__)

__all__ = [
    "ROWS",
    "LamConvNet",
    "Table2Config",
    "load_config",
    "main",
    "SWEEP_MINERS",
    "hessian_miner",
    "posthoc_sweep",
    "run_table2",
    "summarize",
    "summarize_sweep",
]

ROWS = (
    "deterministic",
    "mc_dropout",
    "deep_ensemble",
    "hib",
    "lam_posthoc",
    "lam_online",
    "lam_posthoc_kron",
    "lam_online_kron",
    "deep_ensemble_aligned",
)
#: the rows a config runs unless it names others (the ``kron`` and ``aligned`` rows are opt-in)
DEFAULT_ROWS = ROWS[:6]
#: the LAM rows and the Hessian structure each uses (``None``: ``Table2Config.hessian_structure``)
_LAM_ROWS: dict[str, tuple[str, str | None]] = {
    "lam_posthoc": ("posthoc", None),
    "lam_online": ("online", None),
    "lam_posthoc_kron": ("posthoc", "kron"),
    "lam_online_kron": ("online", "kron"),
}
#: FashionMNIST training-set mean / std of the pixel intensities in [0, 1]
_MEAN, _STD = 0.2860, 0.3530


@dataclass
class Table2Config:
    """Settings of the LAM Table 2 re-run (the TOML under ``recipes/lam/`` sets them)."""

    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    rows: list[str] = field(default_factory=lambda: list(DEFAULT_ROWS))
    epochs: int = 2
    online_epochs: int = 1
    batch_size: int = 256
    online_batch_size: int = 64
    lr: float = 1e-3
    margin: float = 0.7
    latent_dim: int = 3
    dropout: float = 0.05
    ensemble_members: int = 3
    ensemble_from_seeds: bool = False
    hib_lr: float = 1e-3
    hib_scale: float = 16.0
    hib_bias: float = -8.0
    hib_n_samples: int = 8
    hib_negative_term: str = "log1m_p"
    approximation: str = "fixed"
    geometry: str = "arccos"
    prior_precision: float = 1.0
    hessian_scale: float = 1.0
    alpha: float = 1e-3
    posthoc_optimize_prior: bool = False
    hessian_structure: str = "diag"
    eval_samples: int = 32
    n_train: int | None = None
    n_test: int | None = None
    threads: int = 1
    chunk: int = 1000

    def __post_init__(self) -> None:
        bad = sorted(set(self.rows) - set(ROWS))
        if bad:
            raise ValueError(f"`rows`: unknown {bad}; known {list(ROWS)}")
        if not self.seeds:
            raise ValueError("`seeds` must not be empty")
        for name in ("epochs", "batch_size", "online_batch_size", "latent_dim", "eval_samples"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"`{name}` must be >= 1, got {getattr(self, name)}")
        if int(self.online_epochs) < 0:
            raise ValueError(f"`online_epochs` must be >= 0, got {self.online_epochs}")
        if self.ensemble_from_seeds and len(self.seeds) < 2:
            raise ValueError("`ensemble_from_seeds` needs at least 2 `seeds`")
        if int(self.ensemble_members) < 2:
            raise ValueError(f"`ensemble_members` must be >= 2, got {self.ensemble_members}")
        if int(self.eval_samples) < 2:
            raise ValueError("`eval_samples` must be >= 2 (LAM's sigma is a std of draws)")
        if self.hessian_structure not in ("diag", "kron"):
            raise ValueError(
                f"`hessian_structure` must be 'diag' or 'kron', got {self.hessian_structure!r}"
            )


def load_config(path: str | Path) -> Table2Config:
    """Read a :class:`Table2Config` from the ``[table2]`` table of a TOML file.

    Raises
    ------
    ValueError
        On an unknown key (named) or a missing ``[table2]`` table.
    """
    import tomllib

    with open(path, "rb") as f:
        data = tomllib.load(f)
    if "table2" not in data:
        raise ValueError(f"`path`: {path} has no [table2] table")
    known = {f.name for f in fields(Table2Config)}
    unknown = sorted(set(data["table2"]) - known)
    if unknown:
        raise ValueError(f"`path`: unknown keys {unknown} in [table2] of {path}")
    return Table2Config(**data["table2"])


# --------------------------------------------------------------------------------------------
# network and data
# --------------------------------------------------------------------------------------------
class LamConvNet(nn.Module):
    """Two ReLU conv layers and one linear layer (LAM section 5, FashionMNIST network).

    ``conv(1, 32, 3) - ReLU - maxpool 2 - conv(32, 64, 3) - ReLU - maxpool 2 - [Dropout2d] -
    flatten (1600) - linear(1600, latent_dim)``. The authors' net has the same two convs but
    pools once (9216 features); the extra pooling makes an epoch ~2.4x cheaper on two
    shared CPU cores. MC dropout drops whole channels after the second conv (the authors
    also drop after the first; dropping only at the end lets the S draws share one conv pass).
    ``kappa_head`` adds a softplus concentration (HIB).
    """

    def __init__(self, latent_dim: int = 3, dropout: float = 0.0, kappa_head: bool = False):
        super().__init__()
        self.backbone = nn.Sequential(
            nn.Conv2d(1, 32, 3),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.dropout = nn.Dropout2d(dropout) if dropout > 0 else nn.Identity()
        self.linear = nn.Linear(64 * 5 * 5, latent_dim)
        self.kappa = nn.Linear(64 * 5 * 5, 1) if kappa_head else None

    def head(self, h: Tensor) -> Tensor:
        """Unnormalised embedding from backbone maps ``h`` (dropout applied if training)."""
        return self.linear(self.dropout(h).flatten(1))

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.backbone(x))

    def mu_kappa(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Unit mean direction and vMF concentration (``kappa_head`` only)."""
        if self.kappa is None:
            raise ValueError("this LamConvNet has no kappa head")
        h = self.backbone(x).flatten(1)
        return F.normalize(self.linear(h), dim=1), F.softplus(self.kappa(h)).squeeze(1) + 1e-2


def _prep(images: Tensor) -> Tensor:
    return (images.float().div(255.0) - _MEAN) / _STD


def load_data(cfg: Table2Config) -> dict[str, Tensor]:
    """FashionMNIST train / test (normalised floats) and the upsampled digits (OOD)."""
    from bayesurl.data.fmnist import fashion_mnist
    from bayesurl.data.sklearn_digits import load_digits_images

    tr, te = fashion_mnist(split="train"), fashion_mnist(split="test")
    n_tr = len(tr.targets) if cfg.n_train is None else int(cfg.n_train)
    n_te = len(te.targets) if cfg.n_test is None else int(cfg.n_test)
    ood, _ = load_digits_images(size=28)
    return {
        "x_train": _prep(tr.images[:n_tr]),
        "y_train": tr.targets[:n_tr].long(),
        "x_test": _prep(te.images[:n_te]),
        "y_test": te.targets[:n_te].long(),
        "x_ood": _prep(ood),
    }


class _Batches:
    """Reshuffled (x, y) mini-batches, one new permutation per pass (seeded)."""

    def __init__(self, x: Tensor, y: Tensor, batch_size: int, seed: int) -> None:
        self.x, self.y, self.b = x, y, int(batch_size)
        self.g = torch.Generator().manual_seed(int(seed))
        self.dataset = y  # len() for train_online's dataset_size

    def __len__(self) -> int:
        return math.ceil(len(self.y) / self.b)

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor]]:
        perm = torch.randperm(len(self.y), generator=self.g)
        for i in range(0, len(perm), self.b):
            idx = perm[i : i + self.b]
            yield self.x[idx], self.y[idx]


def _chunks(x: Tensor, size: int) -> Iterator[Tensor]:
    for i in range(0, x.shape[0], size):
        yield x[i : i + size]


# --------------------------------------------------------------------------------------------
# training
# --------------------------------------------------------------------------------------------
def _train_deterministic(cfg: Table2Config, data: dict[str, Tensor], seed: int, dropout: float):
    from bayesurl.laplace import train_contrastive

    torch.manual_seed(seed)
    net = LamConvNet(cfg.latent_dim, dropout)
    opt = torch.optim.Adam(net.parameters(), lr=cfg.lr)
    batches = _Batches(data["x_train"], data["y_train"], cfg.batch_size, seed)
    hist = train_contrastive(net, batches, opt, cfg.epochs, margin=cfg.margin, progress=True)
    return net.eval(), hist


def _train_hib(cfg: Table2Config, data: dict[str, Tensor], seed: int):
    from bayesurl.losses.hib import HIBLoss

    torch.manual_seed(seed)
    net = LamConvNet(cfg.latent_dim, kappa_head=True)
    opt = torch.optim.Adam(net.parameters(), lr=cfg.hib_lr)
    loss_fn = HIBLoss(
        scale=cfg.hib_scale,
        bias=cfg.hib_bias,
        n_samples=cfg.hib_n_samples,
        negative_term=cfg.hib_negative_term,
    )
    hist = []
    net.train()
    for _ in range(cfg.epochs):
        tot, cnt = 0.0, 0
        for xb, yb in _Batches(data["x_train"], data["y_train"], cfg.batch_size, seed):
            mu, kappa = net.mu_kappa(xb)
            loss = loss_fn(mu, yb, kappa=kappa)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            tot, cnt = tot + float(loss.detach()), cnt + 1
        hist.append(tot / max(cnt, 1))
    return net.eval(), hist


# --------------------------------------------------------------------------------------------
# prediction: (embedding or None, u or None, samples [S, N, D] or None) per input set
# --------------------------------------------------------------------------------------------
Pred = tuple["Tensor | None", "Tensor | None", "Tensor | None"]


@torch.no_grad()
def _predict_deterministic(net: LamConvNet, x: Tensor, chunk: int) -> Pred:
    z = torch.cat([net(c) for c in _chunks(x, chunk)])
    return F.normalize(z, dim=1), None, None


@torch.no_grad()
def _predict_dropout(net: LamConvNet, x: Tensor, n: int, chunk: int, g: torch.Generator) -> Pred:
    net.eval()
    net.dropout.train()
    out = []
    for c in _chunks(x, chunk):
        h = net.backbone(c)
        p = net.dropout.p
        draws = []
        for _ in range(n):
            keep = (torch.rand(h.shape[0], h.shape[1], 1, 1, generator=g) >= p).to(h.dtype)
            draws.append(F.normalize(net.linear((h * keep / (1 - p)).flatten(1)), dim=1))
        out.append(torch.stack(draws))
    net.dropout.eval()
    return None, None, torch.cat(out, dim=1)


@torch.no_grad()
def _predict_ensemble(nets: Sequence[LamConvNet], x: Tensor, chunk: int) -> Pred:
    s = torch.stack([_predict_deterministic(m, x, chunk)[0] for m in nets])  # type: ignore[misc]
    return None, None, s


def _procrustes(src: Tensor, dst: Tensor) -> Tensor:
    """Orthogonal ``R`` minimising ``||src R - dst||_F`` (Schoenemann 1966): ``U V^T`` of
    the SVD ``src^T dst = U S V^T``."""
    u, _, vh = torch.linalg.svd(src.T @ dst)
    return u @ vh


@torch.no_grad()
def _predict_ensemble_aligned(
    nets: Sequence[LamConvNet], x: Tensor, x_fit: Tensor, chunk: int
) -> Pred:
    """Members rotated onto the first member's embedding frame before they are stacked.

    The contrastive loss is invariant to rotations of the embedding space, so independently
    trained members agree only up to an orthogonal map; each member's map onto member 0 is
    fitted on ``x_fit`` (the training images) by orthogonal Procrustes and applied to its
    embeddings of ``x``. Not in LAM or its code (``deep_ensemble_model.py`` averages the
    unaligned embeddings, as the ``deep_ensemble`` row does); a diagnostic of that row.
    """
    ref = _predict_deterministic(nets[0], x_fit, chunk)[0]
    out = []
    for m in nets:
        z = _predict_deterministic(m, x, chunk)[0]
        if m is not nets[0]:
            r = _procrustes(_predict_deterministic(m, x_fit, chunk)[0], ref)  # type: ignore[arg-type]
            z = F.normalize(z @ r, dim=1)  # type: ignore[operator]
        out.append(z)
    return None, None, torch.stack(out)  # type: ignore[arg-type]


@torch.no_grad()
def _predict_hib(net: LamConvNet, x: Tensor, n: int, chunk: int, g: torch.Generator) -> Pred:
    from bayesurl.distributions.vmf import sample_vmf

    mus, kappas = zip(*(net.mu_kappa(c) for c in _chunks(x, chunk)))
    mu, kappa = torch.cat(mus), torch.cat(kappas)
    return mu, 1.0 / kappa, sample_vmf(mu, kappa, n, generator=g)


@torch.no_grad()
def _predict_laplace(la: Any, x: Tensor, n: int, chunk: int, g: torch.Generator) -> Pred:
    outs = [la.predictive(c, n_samples=n, generator=g) for c in _chunks(x, chunk)]
    return (
        torch.cat([o.embedding for o in outs]),
        torch.cat([o.uncertainty for o in outs]),
        torch.cat([o.samples for o in outs], dim=1),
    )


def _ensemble_preds(
    row: str, nets: Sequence[LamConvNet], data: dict[str, Tensor], chunk: int
) -> tuple[Pred, Pred]:
    if row == "deep_ensemble_aligned":
        return tuple(  # type: ignore[return-value]
            _predict_ensemble_aligned(nets, data[k], data["x_train"], chunk)
            for k in ("x_test", "x_ood")
        )
    return _predict_ensemble(nets, data["x_test"], chunk), _predict_ensemble(
        nets, data["x_ood"], chunk
    )


# --------------------------------------------------------------------------------------------
# metrics
# --------------------------------------------------------------------------------------------
def _metrics(pred_id: Pred, pred_ood: Pred, y: Tensor, *, deterministic: bool) -> dict[str, Any]:
    from bayesurl.evaluation import evaluate
    from bayesurl.evaluation.lam_reference import lam_metrics

    emb, u, s = pred_id
    s_ood = pred_ood[2]
    res = evaluate(
        emb,
        y,
        uncertainties=u,
        samples=s,
        ood_uncertainties=None if deterministic else _u_of(pred_ood),
        ks=(1, 5, 10),
        map_ks=(1, 5, 10),
    )
    keep = ("map@1", "map@5", "map@10", "r@1", "ood_auroc", "ood_auprc", "ausc", "ece", "r_auroc")
    out = {k: res.get(k) for k in keep}
    out["uncertainty_source"] = res.get("uncertainty_source")
    if s is not None:
        lam = lam_metrics(s, y, ood_samples=s_ood)
        out.update(lam)
    return out


def _u_of(pred: Pred) -> Tensor | None:
    """u of a prediction: the given one, else 1/kappa_hat of the draws (as evaluate does)."""
    _, u, s = pred
    if u is not None:
        return u
    if s is None:
        return None
    from bayesurl.evaluation.functional import uncertainty_from_samples

    return uncertainty_from_samples(s)


# --------------------------------------------------------------------------------------------
# driver
# --------------------------------------------------------------------------------------------
def _result_path(out: Path, row: str, seed: int) -> Path:
    return out / f"{row}_s{seed}.json"


def _write(path: Path, payload: Any) -> None:
    write_json(path, payload, indent=1, sort_keys=True)


def run_table2(cfg: Table2Config, out: str | Path, *, models: str | Path | None = None) -> None:
    """Run every missing (row, seed) of ``cfg`` and write its JSON into ``out``.

    ``models`` (default ``out / "models"``) caches the deterministic / dropout / HIB /
    ensemble weights (``weights_only`` state dicts) so rows that reuse them and resumed runs
    do not retrain. Nothing is recomputed for a JSON that exists.
    """
    torch.set_num_threads(int(cfg.threads))
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    mdir = Path(models) if models is not None else out / "models"
    mdir.mkdir(parents=True, exist_ok=True)
    data = load_data(cfg)
    settings = asdict(cfg)
    _log.info(
        "data: train %s, test %s, ood %s",
        tuple(data["x_train"].shape),
        tuple(data["x_test"].shape),
        tuple(data["x_ood"].shape),
    )

    def cached(name: str, seed: int, train: Any, dropout: float = 0.0, hib: bool = False):
        path = mdir / f"{name}_s{seed}.pt"
        if path.exists():
            net = LamConvNet(cfg.latent_dim, dropout, kappa_head=hib)
            net.load_state_dict(torch.load(path, weights_only=True))
            return net.eval(), None, 0.0
        t0 = time.perf_counter()
        net, hist = train()
        dt = time.perf_counter() - t0
        with atomic_open(path, "wb") as fh:
            torch.save(net.state_dict(), fh)
        atomic_write(mdir / f"{name}_s{seed}.time", f"{dt:.3f}")
        return net, hist, dt

    def train_time(name: str, seed: int) -> float | None:
        p = mdir / f"{name}_s{seed}.time"
        return float(p.read_text()) if p.exists() else None

    for seed in cfg.seeds:
        for row in cfg.rows:
            path = _result_path(out, row, seed)
            ens = row in ("deep_ensemble", "deep_ensemble_aligned")
            if ens and cfg.ensemble_from_seeds and seed != cfg.seeds[-1]:
                continue  # one ensemble of the seeds' deterministic models, at the last seed
            if path.exists():
                _log.info("skip %s seed %d (done)", row, seed)
                continue
            _log.info("start %s seed %d", row, seed)
            t_row = time.perf_counter()
            g = torch.Generator().manual_seed(10_000 + seed)
            extra: dict[str, Any] = {}
            det = row in ("deterministic", "deep_ensemble", "deep_ensemble_aligned", *_LAM_ROWS)
            if det:
                net, hist, _ = cached(
                    "det",
                    seed,
                    lambda s=seed: _train_deterministic(cfg, data, s, 0.0),
                )
                if hist is not None:
                    extra["det_loss_history"] = hist
            if row == "deterministic":
                p_id = _predict_deterministic(net, data["x_test"], cfg.chunk)
                p_ood: Pred = (None, None, None)
                trained = train_time("det", seed)
            elif row == "mc_dropout":
                net, hist, _ = cached(
                    "mcd",
                    seed,
                    lambda s=seed: _train_deterministic(cfg, data, s, cfg.dropout),
                    dropout=cfg.dropout,
                )
                p_id = _predict_dropout(net, data["x_test"], cfg.eval_samples, cfg.chunk, g)
                p_ood = _predict_dropout(net, data["x_ood"], cfg.eval_samples, cfg.chunk, g)
                trained = train_time("mcd", seed)
            elif ens and cfg.ensemble_from_seeds:
                # the deterministic models of every seed (all trained by now: the
                # deterministic row of each earlier seed ran first) as one ensemble
                nets, trained = [], 0.0
                for sm in cfg.seeds:
                    mnet, _, _ = cached(
                        "det", sm, lambda s=sm: _train_deterministic(cfg, data, s, 0.0)
                    )
                    nets.append(mnet)
                    trained += train_time("det", sm) or 0.0
                extra["members"] = [f"deterministic seed {sm}" for sm in cfg.seeds]
                p_id, p_ood = _ensemble_preds(row, nets, data, cfg.chunk)
            elif ens:
                nets = [net]
                trained = train_time("det", seed) or 0.0
                for m in range(1, cfg.ensemble_members):
                    sm = 1000 * m + seed
                    mnet, _, _ = cached(
                        f"ens{m}", seed, lambda s=sm: _train_deterministic(cfg, data, s, 0.0)
                    )
                    nets.append(mnet)
                    trained += train_time(f"ens{m}", seed) or 0.0
                p_id, p_ood = _ensemble_preds(row, nets, data, cfg.chunk)
            elif row == "hib":
                net, hist, _ = cached(
                    "hib", seed, lambda s=seed: _train_hib(cfg, data, s), hib=True
                )
                p_id = _predict_hib(net, data["x_test"], cfg.eval_samples, cfg.chunk, g)
                p_ood = _predict_hib(net, data["x_ood"], cfg.eval_samples, cfg.chunk, g)
                trained = train_time("hib", seed)
            else:
                from bayesurl.laplace import MetricLaplace, train_online

                mode, structure = _LAM_ROWS[row]
                structure = structure or cfg.hessian_structure
                extra["hessian_structure"] = structure
                model = copy.deepcopy(net)
                common = dict(
                    approximation=cfg.approximation,
                    geometry=cfg.geometry,
                    prior_precision=cfg.prior_precision,
                    margin=cfg.margin,
                    hessian_scale=cfg.hessian_scale,
                    hessian_structure=structure,
                )
                t0 = time.perf_counter()
                if mode == "posthoc":
                    la = MetricLaplace(model, "linear", mode="posthoc", **common)
                    la.fit(
                        _Batches(data["x_train"], data["y_train"], cfg.batch_size, seed),
                        progress=True,
                    )
                    if cfg.posthoc_optimize_prior:
                        extra["prior_precision"] = la.optimize_prior_precision()
                else:
                    la = MetricLaplace(
                        model,
                        "linear",
                        mode="online",
                        alpha=cfg.alpha,
                        dataset_size=len(data["y_train"]),
                        **common,
                    )
                    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
                    extra["online_loss_history"] = train_online(
                        la,
                        _Batches(data["x_train"], data["y_train"], cfg.online_batch_size, seed),
                        opt,
                        cfg.online_epochs,
                        generator=torch.Generator().manual_seed(seed),
                        progress=True,
                    )
                model.eval()
                trained = time.perf_counter() - t0
                extra["fit_report"] = la.fit_report
                extra["hessian_min"] = float(la.hessian.min())
                extra["clamped_fraction"] = la.clamped_fraction
                p_id = _predict_laplace(la, data["x_test"], cfg.eval_samples, cfg.chunk, g)
                p_ood = _predict_laplace(la, data["x_ood"], cfg.eval_samples, cfg.chunk, g)
            metrics = _metrics(p_id, p_ood, data["y_test"], deterministic=row == "deterministic")
            payload = {
                "row": row,
                "seed": seed,
                "metrics": metrics,
                "train_seconds": trained,
                "row_wall_seconds": time.perf_counter() - t_row,
                "settings": settings,
                "ood_set": "scikit-learn digits upsampled to 28x28 (MNIST unavailable offline)",
                **extra,
            }
            _write(path, payload)
            _log.info(
                "done %s seed %d in %.0f s: %s",
                row,
                seed,
                payload["row_wall_seconds"],
                {
                    k: None if v is None else round(v, 4)
                    for k, v in metrics.items()
                    if k != "uncertainty_source"
                },
            )


# --------------------------------------------------------------------------------------------
# table
# --------------------------------------------------------------------------------------------
COLUMNS = (
    ("map@1", "mAP@1"),
    ("map@5", "mAP@5"),
    ("map@10", "mAP@10"),
    ("ood_auroc", "AUROC"),
    ("ood_auprc", "AUPRC"),
    ("ausc", "AUSC"),
    ("ece", "ECE"),
    ("lam_ood_auroc", "AUROC (LAM code)"),
    ("lam_ood_auprc", "AUPRC (LAM code)"),
    ("lam_ausc", "AUSC (LAM code)"),
    ("lam_ece", "ECE (LAM code)"),
)


def summarize(out: str | Path) -> dict[str, dict[str, Any]]:
    """Mean +- std over seeds of every row in ``out``; writes ``table.md`` and ``table.csv``.

    Returns
    -------
    dict
        ``row -> {"seeds": [...], metric: (mean, std) or None, "train_seconds": mean}``.
    """
    out = Path(out)
    runs: dict[str, list[dict[str, Any]]] = {}
    for row in ROWS:  # only the rows' files (other JSON, e.g. sweeps, may sit beside them)
        for p in sorted(out.glob(f"{row}_s*.json")):
            d = json.loads(p.read_text())
            runs.setdefault(d["row"], []).append(d)
    table: dict[str, dict[str, Any]] = {}
    for row in ROWS:
        if row not in runs:
            continue
        rs = sorted(runs[row], key=lambda d: d["seed"])
        entry: dict[str, Any] = {"seeds": [d["seed"] for d in rs]}
        for key, _ in COLUMNS:
            vals = [d["metrics"].get(key) for d in rs]
            vals = [v for v in vals if v is not None]
            entry[key] = (
                None
                if not vals
                else (statistics.fmean(vals), statistics.stdev(vals) if len(vals) > 1 else 0.0)
            )
        times = [d.get("train_seconds") for d in rs if d.get("train_seconds") is not None]
        entry["train_seconds"] = statistics.fmean(times) if times else None
        entry["row_wall_seconds"] = sum(d.get("row_wall_seconds", 0.0) for d in rs)
        table[row] = entry

    def cell(v: Any, n: int) -> str:
        if v is None:
            return "—"
        return f"{v[0]:.3f}" if n == 1 else f"{v[0]:.3f} ± {v[1]:.3f}"

    head = ["row", "seeds", *(h for _, h in COLUMNS), "train [s]"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    csv = [",".join(["row", "n_seeds", *(f"{k}_mean,{k}_std" for k, _ in COLUMNS), "train_s"])]
    for row, e in table.items():
        t = "—" if e["train_seconds"] is None else f"{e['train_seconds']:.0f}"
        lines.append(
            "| "
            + " | ".join(
                [row, str(len(e["seeds"])), *(cell(e[k], len(e["seeds"])) for k, _ in COLUMNS), t]
            )
            + " |"
        )
        vals = []
        for k, _ in COLUMNS:
            vals += ["", ""] if e[k] is None else [f"{e[k][0]:.5f}", f"{e[k][1]:.5f}"]
        csv.append(",".join([row, str(len(e["seeds"])), *vals, t]))
    atomic_write(out / "table.md", "\n".join(lines) + "\n")
    atomic_write(out / "table.csv", "\n".join(csv) + "\n")
    # the same cells as table.md, quoted CSV for the docs page's csv-table
    display = ['"' + '","'.join(head) + '"']
    for line in lines[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        display.append('"' + '","'.join(cells) + '"')
    atomic_write(out / "table_display.csv", "\n".join(display) + "\n")
    return table


# --------------------------------------------------------------------------------------------
# post-hoc investigation and command line
# --------------------------------------------------------------------------------------------
#: Hessian-pair miners of :func:`posthoc_sweep` (``hessian_miner``)
SWEEP_MINERS = ("hard", "loss", "all", "lam_triplet")


class _AllPairs:
    """Every positive and every negative pair of a batch (PML ``get_all_pairs_indices``)."""

    def __call__(self, embeddings: Tensor, labels: Tensor) -> tuple[Tensor, ...]:
        from pytorch_metric_learning.utils import loss_and_miner_utils as lmu

        return lmu.get_all_pairs_indices(labels)


class _CappedTriplets:
    """The LAM authors' Hessian miner: margin-violating triplets, at most ``cap`` per batch.

    FrederikWarburg/bayesian-metric-learning, ``src/lightning/laplace_posthoc_model.py``
    (``fit``) with ``src/miners/triplet_miners.py``: ``TripletMarginMiner(margin,
    type_of_triplets="all")`` on the L2-normalised embeddings (triplets with
    ``d(a, n) - d(a, p) <= margin``), then a random subset of ``max_pairs = 5000`` triplets
    when a batch has more. bayesurl's curvature reads a triplet as the positive pair
    ``(a, p)`` and the negative pair ``(a, n)`` (anchor terms kept, negatives outside the
    contrastive margin dropped), whereas the authors' ``fix`` keeps only the ``p`` and ``n``
    terms of each triplet; the pair balance (one positive per negative) is the same.
    """

    def __init__(self, margin: float, cap: int, generator: torch.Generator) -> None:
        from pytorch_metric_learning.miners import TripletMarginMiner

        self.miner = TripletMarginMiner(margin=margin, type_of_triplets="all")
        self.cap, self.generator = int(cap), generator

    def __call__(self, embeddings: Tensor, labels: Tensor) -> tuple[Tensor, ...]:
        a, p, n = self.miner(embeddings, labels)
        if a.numel() > self.cap:
            keep = torch.randperm(a.numel(), generator=self.generator)[: self.cap]
            a, p, n = a[keep], p[keep], n[keep]
        return a, p, n


def hessian_miner(
    name: str, margin: float, *, max_triplets: int = 5000, seed: int = 0
) -> Any | None:
    """The Hessian-pair miner ``name`` of :data:`SWEEP_MINERS` for ``MetricLaplace.fit``.

    ``"hard"``: ``None``, i.e. ``MetricLaplace``'s default (PML
    ``BatchEasyHardMiner("hard", "hard")``: the hardest positive and hardest negative of each
    anchor); ``"loss"``: PML ``PairMarginMiner(0, margin)``, the pairs with a non-zero
    contrastive loss (the training miner); ``"all"``: every pair of the batch;
    ``"lam_triplet"``: the LAM authors' miner (see :class:`_CappedTriplets`; LAM section 3,
    "Hard negative mining").

    Raises
    ------
    ValueError
        On an unknown ``name`` (the known ones are listed).
    """
    if name not in SWEEP_MINERS:
        raise ValueError(f"`miner`: unknown {name!r}; known {list(SWEEP_MINERS)}")
    if name == "hard":
        return None
    if name == "loss":
        from pytorch_metric_learning.miners import PairMarginMiner

        return PairMarginMiner(pos_margin=0.0, neg_margin=float(margin))
    if name == "all":
        return _AllPairs()
    return _CappedTriplets(margin, max_triplets, torch.Generator().manual_seed(int(seed)))


class _LinearHead(nn.Module):
    """The last layer of a :class:`LamConvNet` on cached backbone features (same embedding)."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.linear = linear

    def forward(self, h: Tensor) -> Tensor:
        return self.linear(h)


@torch.no_grad()
def _features(net: LamConvNet, x: Tensor, chunk: int) -> Tensor:
    return torch.cat([net.backbone(c).flatten(1) for c in _chunks(x, chunk)])


def _split_list(text: str, what: str) -> list[str]:
    items = [t.strip() for t in str(text).split(",") if t.strip()]
    if not items:
        raise ValueError(f"`{what}` must name at least one value, got {text!r}")
    return items


def posthoc_sweep(
    cfg: Table2Config,
    out: str | Path,
    seed: int = 0,
    priors: str = "1,10,100,1000,10000,ml",
    hessian_scales: str = "1",
    miners: str = "hard",
    fit_batch_size: int | None = None,
    max_triplets: int = 5000,
) -> list[dict[str, Any]]:
    """Post-hoc LAM on a seed's cached deterministic model: miner x hessian_scale x prior.

    For each Hessian-pair miner of ``miners`` (comma-separated names of
    :data:`SWEEP_MINERS`, see :func:`hessian_miner`; ``name@B`` fits that miner with batches
    of ``B``) the GGN diagonal is fitted once on ``out/models/det_s<seed>.pt`` (written by
    :func:`run_table2`) with batches of ``fit_batch_size`` (default ``cfg.batch_size``; the
    LAM authors' post-hoc configs use 64); the posterior precision ``beta relu(H) + lambda``
    (LAM eq. 3) is then varied without refitting over ``hessian_scales`` (``beta``) and
    ``priors`` (``lambda``; ``ml`` = the marginal-likelihood optimum at that ``beta``), and
    each setting is evaluated as in the table (bayesurl's u and the LAM-code u, AUSC, ECE).
    The backbone features are computed once. Appends to ``out/posthoc_sweep_s<seed>.json``
    as settings finish (resumable: a (miner, fit batch, beta, prior) already there is
    skipped) and returns the list.

    Raises
    ------
    ValueError
        On an unknown miner, an empty list, or a non-positive ``hessian_scale``.
    """
    from bayesurl.laplace import MetricLaplace

    default_bs = int(fit_batch_size or cfg.batch_size)
    specs: list[tuple[str, int]] = []  # (miner, fit batch): "name" or "name@batch"
    for spec in _split_list(miners, "miners"):
        name, _, b = spec.partition("@")
        hessian_miner(name, cfg.margin)  # validate every name before any work
        if b and not (b.isdigit() and int(b) >= 1):
            raise ValueError(f"`miners`: bad fit batch size in {spec!r}")
        specs.append((name, int(b) if b else default_bs))
    betas = [float(b) for b in _split_list(hessian_scales, "hessian_scales")]
    if any(not b > 0 for b in betas):
        raise ValueError(f"`hessian_scales` must be positive, got {hessian_scales!r}")
    prior_names = _split_list(priors, "priors")
    threads = torch.get_num_threads()
    torch.set_num_threads(int(cfg.threads))
    out = Path(out)
    path = out / f"posthoc_sweep_s{seed}.json"
    done = json.loads(path.read_text()) if path.exists() else []
    # entries written before the miner option existed used the default miner and cfg's batch
    seen = {
        (d.get("miner", "hard"), d.get("fit_batch_size", cfg.batch_size), d["prior"],
         d["hessian_scale"])
        for d in done
    }  # fmt: skip
    try:
        todo = [
            (m, bs)
            for m, bs in specs
            if any((m, bs, p, b) not in seen for b in betas for p in prior_names)
        ]
        if not todo:
            return done
        data = load_data(cfg)
        net = LamConvNet(cfg.latent_dim)
        net.load_state_dict(torch.load(out / "models" / f"det_s{seed}.pt", weights_only=True))
        net.eval()
        phi = {k: _features(net, data[k], cfg.chunk) for k in ("x_train", "x_test", "x_ood")}
        for name, bs in todo:
            t0 = time.perf_counter()
            la = MetricLaplace(
                _LinearHead(copy.deepcopy(net.linear)), "linear",
                approximation=cfg.approximation, geometry=cfg.geometry, margin=cfg.margin,
                prior_precision=1.0,
            )  # fmt: skip
            la.fit(
                _Batches(phi["x_train"], data["y_train"], bs, seed),
                miner=hessian_miner(name, cfg.margin, max_triplets=max_triplets, seed=seed),
                progress=False,
            )
            fit_s = time.perf_counter() - t0
            _log.info("%s: fit %.0f s, clamped %.3f", name, fit_s, la.clamped_fraction)
            for beta in betas:
                for prior in prior_names:
                    if (name, bs, prior, beta) in seen:
                        continue
                    la.hessian_scale = beta
                    if prior == "ml":
                        la.prior_precision = 1.0
                        lam = la.optimize_prior_precision()
                    else:
                        lam = float(prior)
                        la.prior_precision = lam
                    g = torch.Generator().manual_seed(10_000 + seed)
                    p_id = _predict_laplace(la, phi["x_test"], cfg.eval_samples, cfg.chunk, g)
                    p_ood = _predict_laplace(la, phi["x_ood"], cfg.eval_samples, cfg.chunk, g)
                    m = _metrics(p_id, p_ood, data["y_test"], deterministic=False)
                    done.append(
                        {"miner": name, "fit_batch_size": bs, "prior": prior,
                         "prior_precision": lam, "hessian_scale": beta, "metrics": m,
                         "clamped_fraction": la.clamped_fraction, "n_pairs": la.n_pairs,
                         "fit_seconds": fit_s}
                    )  # fmt: skip
                    seen.add((name, bs, prior, beta))
                    _write(path, done)
                    _log.info(
                        "%s prior %s (lambda %.3g) beta %g: AUROC %.3f / LAM-code %.3f, "
                        "AUSC %.3f / %.3f, ECE %.3f / %.3f",
                        name, prior, lam, beta, m["ood_auroc"], m["lam_ood_auroc"], m["ausc"],
                        m["lam_ausc"], m["ece"], m["lam_ece"],
                    )  # fmt: skip
    finally:
        torch.set_num_threads(threads)
    return done


_SWEEP_COLUMNS = (
    ("ood_auroc", "AUROC"),
    ("lam_ood_auroc", "AUROC (LAM code)"),
    ("ausc", "AUSC"),
    ("lam_ausc", "AUSC (LAM code)"),
    ("ece", "ECE"),
    ("lam_ece", "ECE (LAM code)"),
)


def summarize_sweep(
    out: str | Path, default_fit_batch_size: int | None = None
) -> list[dict[str, Any]]:
    """Per-setting table of every ``posthoc_sweep_s<seed>.json`` in ``out``.

    ``default_fit_batch_size`` is the fit batch of entries written before the sweep recorded
    it (they used the config's ``batch_size``; :func:`main` passes it).

    One row per (miner, fit batch, ``hessian_scale``, prior) with each metric of
    ``_SWEEP_COLUMNS`` as mean ± std over the seeds that have it (and the per-seed values),
    the clamped fraction and the fitted ``lambda``; written to ``out/posthoc_sweep.md`` and
    (quoted CSV, for the docs) ``out/posthoc_sweep_display.csv``.

    Returns
    -------
    list of dict
        ``{"miner", "fit_batch_size", "hessian_scale", "prior", "seeds", metric: [values],
        "clamped_fraction": [values], "prior_precision": [values]}``, ordered by miner
        (as in :data:`SWEEP_MINERS`), fit batch, ``hessian_scale`` and prior.
    """
    out = Path(out)
    rows: dict[tuple, dict[str, Any]] = {}
    for p in sorted(out.glob("posthoc_sweep_s*.json")):
        seed = int(p.stem.rsplit("_s", 1)[1])
        for d in json.loads(p.read_text()):
            bs = d.get("fit_batch_size", default_fit_batch_size)
            key = (d.get("miner", "hard"), bs, d["hessian_scale"], d["prior"])
            r = rows.setdefault(
                key,
                {"miner": key[0], "fit_batch_size": key[1], "hessian_scale": key[2],
                 "prior": key[3], "seeds": [], "clamped_fraction": [], "prior_precision": [],
                 **{k: [] for k, _ in _SWEEP_COLUMNS}},
            )  # fmt: skip
            r["seeds"].append(seed)
            r["clamped_fraction"].append(d["clamped_fraction"])
            r["prior_precision"].append(d["prior_precision"])
            for k, _ in _SWEEP_COLUMNS:
                r[k].append(d["metrics"][k])

    def order(k: tuple) -> tuple:
        miner, bs, beta, prior = k
        rank = SWEEP_MINERS.index(miner) if miner in SWEEP_MINERS else len(SWEEP_MINERS)
        return (rank, bs or 0, beta, prior == "ml", 0.0 if prior == "ml" else float(prior))

    rows = {k: rows[k] for k in sorted(rows, key=order)}

    def cell(vals: list[float]) -> str:
        if len(vals) == 1:
            return f"{vals[0]:.3f}"
        per = " / ".join(f"{v:.3f}" for v in vals)
        return f"{statistics.fmean(vals):.3f} ± {statistics.stdev(vals):.3f} ({per})"

    head = ["miner", "fit batch", "beta", "prior", "lambda", "seeds", "clamped",
            *(h for _, h in _SWEEP_COLUMNS)]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows.values():
        lam = r["prior_precision"]
        lines.append(
            "| "
            + " | ".join(
                [
                    r["miner"],
                    str(r["fit_batch_size"] or ""),
                    f"{r['hessian_scale']:g}",
                    str(r["prior"]),
                    " / ".join(f"{v:.3g}" for v in lam),
                    ",".join(map(str, r["seeds"])),
                    " / ".join(f"{v:.2f}" for v in r["clamped_fraction"]),
                    *(cell(r[k]) for k, _ in _SWEEP_COLUMNS),
                ]
            )  # fmt: skip
            + " |"
        )
    atomic_write(out / "posthoc_sweep.md", "\n".join(lines) + "\n")
    # the same cells, quoted CSV for the docs page's csv-table
    display = [
        '"' + '","'.join(c.strip() for c in line.strip().strip("|").split("|")) + '"'
        for i, line in enumerate(lines)
        if i != 1
    ]
    atomic_write(out / "posthoc_sweep_display.csv", "\n".join(display) + "\n")
    return list(rows.values())


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m bayesurl.experiments.lam_table2 CONFIG --out DIR [--summarize]
    [--posthoc-sweep SEED [--priors ...] [--hessian-scales ...] [--miners ...]
    [--fit-batch-size B]]``: run (resumably), summarise, or sweep post-hoc LAM."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m bayesurl.experiments.lam_table2")
    ap.add_argument("config", help="TOML file with a [table2] table")
    ap.add_argument("--out", required=True, help="results folder (JSON per row and seed)")
    ap.add_argument("--models", default=None, help="weights cache (default OUT/models)")
    ap.add_argument("--summarize", action="store_true", help="only rebuild the table")
    ap.add_argument("--posthoc-sweep", type=int, default=None, metavar="SEED")
    ap.add_argument("--priors", default="1,10,100,1000,10000,ml")
    ap.add_argument("--hessian-scales", default="1")
    ap.add_argument(
        "--miners",
        default="hard",
        help=f"Hessian-pair miners, comma-separated, NAME or NAME@BATCH: {SWEEP_MINERS}",
    )
    ap.add_argument("--fit-batch-size", type=int, default=None, help="default: batch_size")
    ap.add_argument("--max-triplets", type=int, default=5000, help="lam_triplet cap per batch")
    ap.add_argument(
        "--summarize-sweep", action="store_true", help="only write OUT/posthoc_sweep.md"
    )
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    cfg = load_config(args.config)
    if args.summarize_sweep:
        summarize_sweep(args.out, cfg.batch_size)
        print((Path(args.out) / "posthoc_sweep.md").read_text())
        return
    if args.posthoc_sweep is not None:
        posthoc_sweep(
            cfg, args.out, args.posthoc_sweep, args.priors, args.hessian_scales, args.miners,
            args.fit_batch_size, args.max_triplets,
        )  # fmt: skip
        return
    if not args.summarize:
        t0 = time.perf_counter()
        run_table2(cfg, args.out, models=args.models)
        _log.info("wall time of this invocation: %.0f s", time.perf_counter() - t0)
    summarize(args.out)
    print((Path(args.out) / "table.md").read_text())


if __name__ == "__main__":
    main()
