"""bayesurl's MetricLaplace against the LAM authors' code on one PML-trained net.

A small conv net is trained with pytorch-metric-learning (``ContrastiveLoss`` +
``MultiSimilarityMiner``, 3,000 FashionMNIST images, 5 epochs, seed 0). On that one net, with
the same weights and the same data, the script fits the post-hoc last-layer Laplace twice:

- **theirs**: the LAM authors' ``LaplacePosthocModel.fit`` / ``sample`` / ``forward``
  (FrederikWarburg/bayesian-metric-learning e0188f4, ``src/lightning/laplace_posthoc_model.py``)
  with their StochMan fork (IlMioFrizzantinoAmabile/stochman 1d285ae:
  ``ArccosHessianCalculator(method="fix")``, ``DiagLaplace``), their triplet miner
  (``TripletMarginMiner`` "all", 5,000 tuples at most per batch), prior precision 1 (their
  default), 100 weight draws and ``u = sum_d std_s(u_sd)`` (their OOD evaluation,
  ``src/evaluate/ood.py``);
- **ours**: :func:`bayesurl.laplace.MetricLaplace` (``fixed`` / ``arccos``) fed the very same
  tuples (``hessian_pairs="all_mined"``, prior 1), then with the hard-pair miner and the
  evidence-optimised prior (its defaults when this comparison was made; the default pair set is
  now the LAM code's, results/lam/hessian_pairs/).

It prints the Hessians' agreement, the Spearman correlation of the per-image u, R@1,
R-AUROC and OOD AUROC (scikit-learn digits as OOD) of every u, all scored by
``bayesurl.evaluate``, and the feature-norm evidence of ``docs/concepts/laplace.rst`` (how u follows
``||phi|| / ||z||``, the last layer's input and output norms).

Usage (from the repository root; AUTHORS_DIR laid out as the authors' README says, i.e. holding
the StochMan fork's ``stochman/`` package beside their ``src/``)::

    python tools/lam_authors_compare.py AUTHORS_DIR [--out results/lam/pml_comparison.txt]

Without AUTHORS_DIR (or with one lacking those files) it prints why and exits 0 (skipped).
About 1 minute on one core.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
import time
from pathlib import Path

import torch
from scipy.stats import spearmanr
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import bayesurl
from bayesurl.data import as_tensors, default_transform, default_zero_shot
from bayesurl.files import atomic_write
from bayesurl.laplace import MetricLaplace, train_online

MARGIN = 0.2
MAX_PAIRS = 5000  # the authors' ``max_pairs`` default
N_DRAWS = 100  # the authors' ``test_n_samples`` default


def _authors_modules(root: Path):
    """Import the StochMan fork from ``root`` (or return why not)."""
    need = root / "stochman" / "hessian.py"
    if not need.is_file():
        return None, f"missing {need}"
    sys.path.insert(0, str(root))
    # their src/miners/triplet_miners.py is PML's TripletMarginMiner on an older PML base
    # class (BaseTupleMiner, gone from current PML); PML's own gives the same "all" tuples
    from pytorch_metric_learning.miners import TripletMarginMiner
    from stochman import ArccosHessianCalculator
    from stochman.laplace import DiagLaplace
    from stochman.utils import convert_to_stochman

    return (TripletMarginMiner, ArccosHessianCalculator, DiagLaplace, convert_to_stochman), ""


def _net() -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 32),
    )  # fmt: skip


def train_pml_net(x: torch.Tensor, y: torch.Tensor, seed: int = 0) -> nn.Sequential:
    """The user's PML training loop: ContrastiveLoss(0, 0.2) on normalised embeddings; ``seed``
    sets the initialisation and the batch order (0: the tutorial's net)."""
    from pytorch_metric_learning import distances, losses, miners

    torch.manual_seed(seed)
    net = _net()
    loss_fn = losses.ContrastiveLoss(
        pos_margin=0, neg_margin=MARGIN, distance=distances.LpDistance(normalize_embeddings=True)
    )
    miner = miners.MultiSimilarityMiner(epsilon=0.1)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    for _ in range(5):
        gen = torch.Generator().manual_seed(seed)  # as the tutorial's loader(): same each epoch
        for xb, yb in DataLoader(TensorDataset(x, y), 128, shuffle=True, generator=gen):
            emb = net(xb)
            loss = loss_fn(emb, yb, miner(emb, yb))
            opt.zero_grad()
            loss.backward()
            opt.step()
    return net.eval()


def _loader(x: torch.Tensor, y: torch.Tensor) -> DataLoader:
    """Online training batches as in ``plot_7``: one loader seeded 0, iterated every epoch."""
    gen = torch.Generator().manual_seed(0)
    return DataLoader(TensorDataset(x, y), 128, shuffle=True, generator=gen)


def _authors_loss():
    """The LAM code's training loss for ``loss: arccos``: PML's hinge contrastive loss on
    normalised embeddings (``configure_metric_loss``)."""
    from pytorch_metric_learning import distances, losses

    return losses.ContrastiveLoss(pos_margin=0, neg_margin=MARGIN, distance=distances.LpDistance())


def authors_online(x, y, mods, epochs: int = 5):
    """The authors' ``LaplaceOnlineModel.training_step`` (e0188f4) on the tutorial's net.

    Same init (seed 0), batches (128, one seeded loader over the epochs) and optimiser
    (Adam 1e-3) as the online net of ``plot_7_pml_to_lam.py``; their settings otherwise: one
    weight draw per step from ``N(theta, 1 / (relu(H) + 1))``, PML ``ContrastiveLoss(0, margin,
    LpDistance())`` on the tuples of ``TripletMarginMiner("all")``, the Hessian of at most
    5,000 of those tuples scaled by ``N^2 / #tuples``, ``H <- 0.999 H + relu(H_batch)``
    from ``H = N``. Returns ``(body, lin, H)``.
    """
    triplet_miner_cls, arccos_calc_cls, diag_laplace_cls, convert_to_stochman = mods
    torch.manual_seed(0)
    net = _net()
    body, lin = net[:-1], convert_to_stochman(nn.Sequential(net[-1]))
    opt = torch.optim.Adam(list(body.parameters()) + list(lin.parameters()), lr=1e-3)
    laplace = diag_laplace_cls()
    calc = arccos_calc_cls(wrt="weight", shape="diagonal", speed="half", method="fix")
    n = len(y)
    hessian = laplace.init_hessian(n, lin, "cpu")
    loss_fn = _authors_loss()
    miner = triplet_miner_cls(margin=MARGIN, type_of_triplets="all")
    loader = _loader(x, y)
    for _ in range(epochs):
        for xb, yb in loader:
            phi = body(xb)
            sigma_q = laplace.posterior_scale(torch.relu(hessian))
            mu_q = torch.nn.utils.parameters_to_vector(lin.parameters()).unsqueeze(1)
            theta = laplace.sample(mu_q, sigma_q, 1)[0]
            torch.nn.utils.vector_to_parameters(theta, lin.parameters())
            z = nn.functional.normalize(lin(phi), dim=-1)
            loss = loss_fn(z, torch.zeros(len(yb)), miner(z, yb))
            with torch.no_grad():
                tup = miner(z, yb)
                n_tup = len(tup[0])
                if n_tup > MAX_PAIRS:
                    keep = torch.randperm(n_tup)[:MAX_PAIRS]
                    tup = tuple(t[keep] for t in tup)
                h = calc.compute_hessian(phi.detach(), lin, tup)
                h = laplace.scale(h, min(n_tup, MAX_PAIRS), n**2)
            torch.nn.utils.vector_to_parameters(mu_q.squeeze(1), lin.parameters())
            hessian = 0.999 * hessian + torch.relu(h)
            opt.zero_grad()
            loss.backward()
            opt.step()
    return body.eval(), lin, hessian


def authors_u(lin, hessian, phi_sets, n_draws: int = N_DRAWS):
    """Their ``sample`` + ``forward``: ``N_DRAWS`` last layers, ``u = sum_d std_s``, and the
    mean of the normalised draws as the embedding."""
    from stochman.laplace import DiagLaplace

    laplace = DiagLaplace()
    mu_q = torch.nn.utils.parameters_to_vector(lin.parameters()).detach().unsqueeze(1)
    sigma_q = laplace.posterior_scale(torch.relu(hessian), prior_prec=torch.tensor(1.0))
    torch.manual_seed(0)
    draws = laplace.sample(mu_q, sigma_q, n_draws)
    out = []
    with torch.no_grad():
        for phi in phi_sets:
            zs = []
            for theta in draws:
                torch.nn.utils.vector_to_parameters(theta, lin.parameters())
                zs.append(nn.functional.normalize(lin(phi), dim=-1))
            zs = torch.stack(zs)
            out.append((nn.functional.normalize(zs.mean(0), dim=1), zs.std(dim=0).sum(dim=1)))
    torch.nn.utils.vector_to_parameters(mu_q.squeeze(1), lin.parameters())
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("authors_dir", nargs="?", help="checkout with src/ and stochman/")
    ap.add_argument("--out", default="results/lam/pml_comparison.txt")
    args = ap.parse_args()
    if args.authors_dir is None:
        print("SKIPPED: no AUTHORS_DIR given (the LAM authors' checkout with src/ and stochman/)")
        return 0
    mods, why = _authors_modules(Path(args.authors_dir).resolve())
    if mods is None:
        print(f"SKIPPED: {args.authors_dir} is not the authors' checkout ({why})")
        return 0
    triplet_miner_cls, arccos_calc_cls, diag_laplace_cls, convert_to_stochman = mods

    torch.set_num_threads(1)
    t0 = time.time()
    lines: list[str] = []

    def say(s: str = "") -> None:
        print(s, flush=True)
        lines.append(s)

    data = default_zero_shot(max_train=3000, max_test=1000, max_ood=500, val_fraction=0.0)
    to_input = default_transform(1)
    (x_tr, y_tr), (x_te, y_te), (x_ood, _) = (
        as_tensors(s, to_input) for s in (data.train, data.test, data.ood)
    )
    net = train_pml_net(x_tr, y_tr)
    with torch.no_grad():
        checksum = float(sum(p.abs().sum() for p in net.parameters()))
    body, last = net[:-1], net[-1]
    with torch.no_grad():
        phi_tr, phi_te, phi_ood = body(x_tr), body(x_te), body(x_ood)
        z_te, z_ood = last(phi_te), last(phi_ood)

    # the authors' Hessian tuples per batch: their miner on normalised embeddings, subsampled
    torch.manual_seed(0)
    miner = triplet_miner_cls(margin=MARGIN, type_of_triplets="all")
    batches = []
    for idx in torch.arange(len(y_tr)).split(64):  # their fashionmnist batch_size
        with torch.no_grad():
            z = nn.functional.normalize(last(phi_tr[idx]), dim=1)
        tup = miner(z, y_tr[idx])
        if len(tup[0]) > MAX_PAIRS:
            keep = torch.randperm(len(tup[0]))[:MAX_PAIRS]
            tup = tuple(t[keep] for t in tup)
        batches.append((idx, tup))

    # theirs: LaplacePosthocModel.fit / sample / forward on the same last layer
    lin = convert_to_stochman(nn.Sequential(last))
    calc = arccos_calc_cls(wrt="weight", shape="diagonal", speed="half", method="fix")
    h_theirs = 0
    for idx, tup in batches:
        h_theirs = h_theirs + calc.compute_hessian(phi_tr[idx], lin, tup)
    (_, u_te), (_, u_ood) = authors_u(lin, h_theirs, (phi_te, phi_ood))
    u_theirs = {"test": u_te, "ood": u_ood}

    # ours on the very same tuples and prior, then with its own defaults
    loader = [(x_tr[idx], y_tr[idx]) for idx, _ in batches]
    tuples = iter([tup for _, tup in batches])
    same = MetricLaplace(net, approximation="fixed", geometry="arccos", margin=MARGIN,
                         prior_precision=1.0, hessian_pairs="all_mined")  # fmt: skip
    same.fit(loader, miner=lambda z, y: next(tuples), progress=False)
    h_ours = same.hessian
    rel = float((h_ours - h_theirs).norm() / h_theirs.norm())
    # the hard pairs, bayesurl's default when this comparison was made
    own = MetricLaplace(net, approximation="fixed", geometry="arccos", margin=MARGIN,
                        hessian_miner="hard", hessian_pairs="inside_margin")  # fmt: skip
    own.fit(DataLoader(TensorDataset(x_tr, y_tr), 128), progress=False)
    own.optimize_prior_precision()

    def ours_u(la) -> dict[str, torch.Tensor]:
        return {"test": la.predictive(x_te).uncertainty, "ood": la.predictive(x_ood).uncertainty}

    rows = {
        "theirs: sum std (100 draws)": u_theirs,
        "ours, same tuples, prior 1": ours_u(same),
        "ours, defaults (hard pairs, evidence prior)": ours_u(own),
        "1/||z|| (no Laplace)": {"test": 1 / z_te.norm(dim=1), "ood": 1 / z_ood.norm(dim=1)},
        "||phi||^2/||z||^2 (no Laplace)": {
            "test": (phi_te.norm(dim=1) / z_te.norm(dim=1)) ** 2,
            "ood": (phi_ood.norm(dim=1) / z_ood.norm(dim=1)) ** 2,
        },
    }
    emb = nn.functional.normalize(z_te, dim=1)
    say("LAM post-hoc (fixed / arccos) on one PML-trained net: bayesurl vs the authors' code")
    say("net: conv 16-32, fc 128, linear 32; PML ContrastiveLoss(0, 0.2, LpDistance normalised)")
    say("  + MultiSimilarityMiner(0.1), Adam 1e-3, 5 epochs, 3,000 FashionMNIST train images;")
    say("  test 1,000 FashionMNIST (unseen classes 5-9), OOD 500 scikit-learn digits (8x8")
    say("  upsampled to 28x28); seed 0, 1 thread")
    say("authors: bayesian-metric-learning e0188f4 + stochman 1d285ae (ArccosHessianCalculator")
    say(f"  fix, DiagLaplace, TripletMarginMiner all, max {MAX_PAIRS} tuples/batch, prior 1)")
    say(f"trained net: sum of |weights| {checksum:.6f}")
    say("")
    say(f"Hessian diagonal, same tuples: ||H_ours - H_theirs|| / ||H_theirs|| = {rel:.2e}")
    say("")
    say(f"{'u':46s} {'R@1':>6s} {'R-AUROC':>8s} {'OOD AUROC':>9s} {'Spearman vs theirs':>19s}")
    both = torch.cat([u_theirs["test"], u_theirs["ood"]])
    for name, u in rows.items():
        r = bayesurl.evaluate(emb, y_te, uncertainties=u["test"], ood_uncertainties=u["ood"])
        rho = spearmanr(both.numpy(), torch.cat([u["test"], u["ood"]]).double().numpy())[0]
        say(f"{name:46s} {r['r@1']:6.3f} {r['r_auroc']:8.3f} {r['ood_auroc']:9.3f} {rho:19.3f}")

    say("")
    say("ours: OOD AUROC by Hessian pair set (rows; arccos unless named) and prior precision")
    priors = (1e-2, 1.0, 1e2)
    say(f"{'pairs / approximation':46s} {'evidence':>9s}" + "".join(f"{p:>9g}" for p in priors))
    triplets = triplet_miner_cls(margin=MARGIN, type_of_triplets="all")
    for name, approx, miner_s, pairs, batch in [
        ("hardest pos + neg, inside margin / fixed", "fixed", None, "inside_margin", 128),
        ("hardest pos + neg / positive (euclidean)", "positive", None, "inside_margin", 128),
        ("triplets 'all', inside margin / fixed", "fixed", triplets, "inside_margin", 64),
        ("triplets 'all', every mined / fixed", "fixed", triplets, "all_mined", 64),
        ("triplets 'all' / positive (euclidean)", "positive", triplets, "inside_margin", 64),
    ]:
        geometry = "euclidean" if approx == "positive" else "arccos"
        la = MetricLaplace(net, approximation=approx, geometry=geometry, margin=MARGIN,
                           hessian_pairs=pairs, hessian_miner="hard")  # fmt: skip
        la.fit(DataLoader(TensorDataset(x_tr, y_tr), batch), miner=miner_s, progress=False)
        cells = []
        for prior in (None, *priors):
            if prior is None:
                la.optimize_prior_precision()
            else:
                la.prior_precision = prior
            r = bayesurl.evaluate(emb, y_te, uncertainties=la.predictive(x_te).uncertainty,
                                  ood_uncertainties=la.predictive(x_ood).uncertainty)  # fmt: skip
            cells.append(f"{r['ood_auroc']:9.3f}")
        say(f"{name:46s} " + "".join(cells) + f"   (clamped {la.clamped_fraction:.3f})")

    say("")
    say("feature norms (mean over images), ID test vs OOD:")
    for name, a, b in [
        ("||phi|| (last layer's input)", phi_te.norm(dim=1), phi_ood.norm(dim=1)),
        ("||z|| (last layer's output)", z_te.norm(dim=1), z_ood.norm(dim=1)),
        ("||phi|| / ||z||", phi_te.norm(dim=1) / z_te.norm(dim=1),
         phi_ood.norm(dim=1) / z_ood.norm(dim=1)),
        ("||x|| (input image)", x_te.flatten(1).norm(dim=1), x_ood.flatten(1).norm(dim=1)),
    ]:  # fmt: skip
        say(f"  {name:32s} ID {a.mean():9.3f}   OOD {b.mean():9.3f}")
    say("Spearman of u (ours, defaults) with, over ID+OOD images:")
    own_rows = rows["ours, defaults (hard pairs, evidence prior)"]
    u_own = torch.cat([own_rows["test"], own_rows["ood"]])
    for name, v in [
        ("||z||", torch.cat([z_te, z_ood]).norm(dim=1)),
        ("||phi||", torch.cat([phi_te, phi_ood]).norm(dim=1)),
        ("||phi||^2 / ||z||^2", (torch.cat([phi_te, phi_ood]).norm(dim=1)
                                 / torch.cat([z_te, z_ood]).norm(dim=1)) ** 2),
        ("||x||", torch.cat([x_te, x_ood]).flatten(1).norm(dim=1)),
    ]:  # fmt: skip
        say(f"  {name:22s} {spearmanr(u_own.numpy(), v.numpy())[0]:7.3f}")

    # online: each side trains its own net from the same init and batch order
    say("")
    say("Online LAM (fixed / arccos, margin 0.2, Adam 1e-3, 5 epochs, batches of 128): each")
    say("trains its own net from the same init (seed 0) and batch order, so u is compared per")
    say("image across two nets; R@1 of each net's own mean embedding.")
    body_o, lin_o, h_o = authors_online(x_tr, y_tr, mods)
    with torch.no_grad():
        pho_te, pho_ood = body_o(x_te), body_o(x_ood)
    (emb_o, uo_te), (_, uo_ood) = authors_u(lin_o, h_o, (pho_te, pho_ood))
    online_rows = {"theirs (their online training step)": (emb_o, uo_te, uo_ood)}
    triplets = triplet_miner_cls(margin=MARGIN, type_of_triplets="all")
    for name, kw, extra in [
        ("ours, the authors' settings", dict(hessian_pairs="all_mined", alpha=0.001,
          init_hessian=float(len(y_tr)), online_scale="dataset_squared_over_tuples"),
         dict(miner=triplets, hessian_miner=triplets, loss_fn=_authors_loss())),
        ("ours, plot_7's settings", dict(alpha=0.01, hessian_miner="hard",
                                         hessian_pairs="inside_margin"), {}),
    ]:  # fmt: skip
        torch.manual_seed(0)
        net_o = _net()
        la_o = MetricLaplace(
            net_o, mode="online", approximation="fixed", geometry="arccos", margin=MARGIN,
            prior_precision=1.0, dataset_size=len(y_tr), **kw,
        )  # fmt: skip
        opt_o = torch.optim.Adam(net_o.parameters(), lr=1e-3)
        train_online(la_o, _loader(x_tr, y_tr), opt_o, epochs=5, progress=False,
                     generator=torch.Generator().manual_seed(0), **extra)  # fmt: skip
        net_o.eval()
        out_te, out_ood = la_o.predictive(x_te), la_o.predictive(x_ood)
        online_rows[name] = (out_te.embedding, out_te.uncertainty, out_ood.uncertainty)
    say(f"{'u':46s} {'R@1':>6s} {'R-AUROC':>8s} {'OOD AUROC':>9s} {'Spearman vs theirs':>19s}")
    both = torch.cat([uo_te, uo_ood])
    for name, (emb_r, ut, uo) in online_rows.items():
        r = bayesurl.evaluate(emb_r, y_te, uncertainties=ut, ood_uncertainties=uo)
        rho = spearmanr(both.numpy(), torch.cat([ut, uo]).double().numpy())[0]
        say(f"{name:46s} {r['r@1']:6.3f} {r['r_auroc']:8.3f} {r['ood_auroc']:9.3f} {rho:19.3f}")
    say("")
    say(f"({time.time() - t0:.0f} s; machine shared with other sessions)")
    if args.out:
        buf = io.StringIO()
        buf.write("\n".join(lines) + "\n")
        with contextlib.suppress(FileNotFoundError):
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        atomic_write(args.out, buf.getvalue())
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
