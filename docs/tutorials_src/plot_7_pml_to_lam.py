"""
From a pytorch-metric-learning model to LAM, and when its u inverts
===================================================================

You trained an embedding network with pytorch-metric-learning (PML): a ``ContrastiveLoss``,
a miner, your own loop. :func:`bayesurl.laplace.MetricLaplace` puts LAM's Laplace posterior
(Warburg et al., 2023, "Bayesian Metric Learning for Uncertainty Quantification in Image
Retrieval", section 3) on its last linear layer without retraining (post-hoc), or trains a
fresh one with it (online). This page maps PML's options onto ``MetricLaplace``'s, runs both
modes on one small conv net -- and shows that on this net LAM's uncertainty with the hard
pairs (bayesurl's earlier default) ranks the out-of-distribution digits as *more* certain
than the clothes it was trained on, why, what the LAM code's pair set (the default now)
changes, and what to trust. :doc:`/concepts/laplace` ("When the last-layer u inverts") has the
analysis.
"""

# %%
# Train with PML, as you already do
# ---------------------------------
# FashionMNIST classes 0-4 for training (3,000 images), the unseen classes 5-9 for
# retrieval, scikit-learn's 8x8 digits (upsampled to 28x28) as out-of-distribution (OOD) images
# (:doc:`/concepts/zero_shot`).
import warnings

import matplotlib.pyplot as plt
import torch
from pytorch_metric_learning import distances, losses, miners
from scipy.stats import spearmanr
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import bayesurl
from bayesurl.data import as_tensors, default_transform, default_zero_shot
from bayesurl.laplace import MetricLaplace, train_online

torch.set_num_threads(1)
with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # the digits fallback warns when FashionMNIST is absent
    data = default_zero_shot(max_train=3000, max_test=1000, max_ood=500, val_fraction=0.0)
to_input = default_transform(1)
x_train, y_train = as_tensors(data.train, to_input)
x_test, y_test = as_tensors(data.test, to_input)
x_ood, _ = as_tensors(data.ood, to_input)


def make_net() -> nn.Sequential:
    """Two conv blocks, then ``Linear(1568, 128) -> ReLU -> Linear(128, 32)``: the last
    ``nn.Linear`` is the layer LAM puts its posterior on."""
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 32),
    )  # fmt: skip


def loader(shuffle: bool = True, batch_size: int = 128) -> DataLoader:
    gen = torch.Generator().manual_seed(0)
    ds = TensorDataset(x_train, y_train)
    return DataLoader(ds, batch_size=batch_size, shuffle=shuffle, generator=gen)


MARGIN = 0.2
torch.manual_seed(0)
net = make_net()
loss_fn = losses.ContrastiveLoss(
    pos_margin=0, neg_margin=MARGIN, distance=distances.LpDistance(normalize_embeddings=True)
)
miner = miners.MultiSimilarityMiner(epsilon=0.1)
opt = torch.optim.Adam(net.parameters(), lr=1e-3)
for _epoch in range(5):
    for xb, yb in loader():
        emb = net(xb)
        loss = loss_fn(emb, yb, miner(emb, yb))
        opt.zero_grad()
        loss.backward()
        opt.step()
net.eval()

# %%
# PML's options in ``MetricLaplace``'s terms
# ------------------------------------------
# - ``ContrastiveLoss(pos_margin=0, neg_margin=m)`` -> ``margin=m``. LAM's loss is the
#   *squared* contrastive loss (``0.5 d^2`` for positives, ``0.5 max(0, m - d)^2`` for
#   negatives), PML's the hinge (``d`` and ``max(0, m - d)``): the same pairs count at the
#   same margin, with LAM's curvature per pair. A ``pos_margin > 0`` has no counterpart
#   (every positive pair enters the Hessian).
# - ``LpDistance(normalize_embeddings=True)`` (PML's default) -> either geometry:
#   ``geometry="arccos"`` keeps the L2 normalisation inside the loss (its exact Hessian,
#   LAM's best setting), ``"euclidean"`` linearises it as part of the model.
# - ``CosineSimilarity()`` with ``neg_margin=s`` -> the same normalised embeddings; a
#   negative pair is inside the margin when ``cos > s``, i.e. ``||u_a - u_n|| <
#   sqrt(2 - 2 s)``: ``margin=sqrt(2 - 2 * s)``.
# - ``LpDistance(normalize_embeddings=False)`` -> not covered: LAM's embedding is
#   ``normalize(W phi + b)``.
# - your miner -> ``la.fit(loader, miner=your_miner)``: any PML miner gives the Hessian
#   pairs (default: the LAM code's, every triplet of ``TripletMarginMiner(margin, "all")``,
#   at most 5,000 per batch, ``hessian_miner="triplets"``). Every mined pair enters
#   (``hessian_pairs="all_mined"``), negatives outside the margin included, whose loss is
#   flat; ``hessian_pairs="inside_margin"`` drops them.
# - your training loop -> post-hoc: keep it and call ``fit`` afterwards. Online:
#   ``mode="online"`` with :func:`bayesurl.laplace.train_online` replaces it (LAM's own
#   loss, averaged over weight draws; ``miner=`` / ``loss_fn=`` take PML's).
#
# Post-hoc LAM: four pair sets, one trained net
# ---------------------------------------------
# The defaults (the LAM code's triplets, evidence-optimised prior); the hard pairs
# (``hessian_miner="hard"``, ``hessian_pairs="inside_margin"``: the hardest positive and
# negative of each anchor, bayesurl's default until it was measured on four roads,
# :doc:`/concepts/laplace`); the training miner as the Hessian miner; and the LAM authors'
# whole setting (their pairs, batches of 64, prior precision 1). Each u is scored by
# :func:`~bayesurl.evaluation.evaluate` next to ``1 / ||z||``, the inverse norm of the same net's
# unnormalised embedding (no Laplace at all).
with torch.no_grad():
    z_test, z_ood = net(x_test), net(x_ood)
    phi_train, phi_test, phi_ood = net[:-1](x_train), net[:-1](x_test), net[:-1](x_ood)
emb_test = nn.functional.normalize(z_test, dim=1)


def score(name: str, u_test: torch.Tensor, u_ood: torch.Tensor) -> dict:
    r = bayesurl.evaluate(emb_test, y_test, uncertainties=u_test, ood_uncertainties=u_ood)
    # each metric with its 95 % interval over the 1,000 queries, then the notes on this u
    print(f"{name}: {r.describe(['r@1', 'r_auroc', 'ood_auroc'])}")
    return r


inside = {"hessian_pairs": "inside_margin"}
fits = {
    "defaults": dict(miner=None, kw={}, batch_size=128),
    "hard pairs": dict(miner=None, kw={"hessian_miner": "hard", **inside}, batch_size=128),
    "training miner (MultiSimilarity)": dict(
        miner=miners.MultiSimilarityMiner(epsilon=0.1), kw=inside, batch_size=128
    ),
    "LAM authors' setting": dict(miner=None, kw={"prior_precision": 1.0}, batch_size=64),
}
results, posteriors = {}, {}
results["1/||z|| (no Laplace)"] = score(
    "1/||z|| (no Laplace)", 1 / z_test.norm(dim=1), 1 / z_ood.norm(dim=1)
)
for name, f in fits.items():
    la = MetricLaplace(net, approximation="fixed", geometry="arccos", margin=MARGIN, **f["kw"])
    la.fit(loader(False, f["batch_size"]), miner=f["miner"], progress=False)
    if "prior_precision" not in f["kw"]:
        la.optimize_prior_precision()
    posteriors[name] = la
    results[name] = score(
        f"post-hoc LAM, {name}", la.predictive(x_test).uncertainty, la.predictive(x_ood).uncertainty
    )

# %%
# Read the table before using u. Retrieval R-AUROC is near 0.5 for every u, the norm
# included: the notes under each line say where its 95 % interval over the 1,000 queries
# (about 170 of them errors) holds 0.5. For OOD the
# post-hoc LAM u with the hard pairs or the training miner is **inverted**: the digits get
# *lower* u than the clothes (OOD AUROC about 0.25), while ``1/||z||`` of the same net
# separates them (about 0.79). The LAM code's pair set -- the defaults, and the authors'
# whole setting -- moves the u above chance but not far on this net (about 0.56-0.58;
# over five nets trained the same way 0.68 [0.51, 0.85], ``results/lam/hessian_pairs/``).
# It is the u of their code: on an earlier net of this recipe the two agreed to Spearman
# 0.988 (``tools/lam_authors_compare.py``, the Hessian diagonals equal to 4e-7).
#
# Why the hard pairs invert: ``u`` of a last-layer posterior is
# ``sum_d sum_f sigma^2_df phi_f^2 (1 - u_d^2) / ||z||^2``. With the posterior variance
# ``sigma^2`` nearly flat over the weights an input uses, that is ``||phi||^2 / ||z||^2``
# -- the inverse gain of the last layer, blind to the feature *norm* that ``1/||z||``
# reads (digits excite the features less: smaller ``||phi||`` and ``||z||``, and a
# slightly smaller ratio). The only way the posterior can say "unseen" is mass on weights
# the training pairs did not constrain; here the ReLU features that never fire on the
# training images never fire on the digits either.
u_def = torch.cat([posteriors["hard pairs"].predictive(x).uncertainty for x in (x_test, x_ood)])
phi_all, z_all = torch.cat([phi_test, phi_ood]), torch.cat([z_test, z_ood])
gain = (phi_all.norm(dim=1) / z_all.norm(dim=1)) ** 2
rho_gain = spearmanr(u_def.numpy(), gain.numpy())[0]
dead = (phi_train > 0).sum(0) == 0
ood_fires = float((phi_ood[:, dead] > 0).float().mean())
print(f"Spearman(u of the hard pairs, ||phi||^2/||z||^2) = {rho_gain:.3f}")
print(f"||phi|| ID {phi_test.norm(dim=1).mean():.2f}, OOD {phi_ood.norm(dim=1).mean():.2f};  "
      f"||z|| ID {z_test.norm(dim=1).mean():.2f}, OOD {z_ood.norm(dim=1).mean():.2f}")  # fmt: skip
print(
    f"{int(dead.sum())} of {dead.numel()} last-layer input features never fire on the training "
    f"images; fraction of OOD activations among them: {ood_fires:.3f}"
)


n_id = len(x_test)
inv_norm = 1 / z_all.norm(dim=1)
fig, axes = plt.subplots(1, 3, figsize=(13, 4), layout="constrained")
for ax, (title, v) in zip(
    axes[[0, 2]], (("post-hoc LAM u (hard pairs)", u_def), ("1/||z|| (no Laplace)", inv_norm))
):
    bins = torch.linspace(float(v.min()), float(v.max()), 40).numpy()
    ax.hist(v[:n_id].numpy(), bins=bins, alpha=0.6, density=True, label="test (FashionMNIST)")
    ax.hist(v[n_id:].numpy(), bins=bins, alpha=0.6, density=True, label="OOD (digits)")
    ax.set(xlabel=title, ylabel="density", title=title)
    ax.legend()
axes[1].scatter(gain[:n_id], u_def[:n_id], s=4, alpha=0.5, label="test (FashionMNIST)")
axes[1].scatter(gain[n_id:], u_def[n_id:], s=4, alpha=0.5, label="OOD (digits)")
axes[1].set(
    xlabel="||phi||^2 / ||z||^2 (inverse gain of the last layer)",
    ylabel="post-hoc LAM u (hard pairs)",
    title=f"u follows the gain (Spearman {rho_gain:.2f})",
)
axes[1].legend()
plt.show()

# %%
# The LAM code's pairs work here by a side effect: they subtract the curvature of mined
# negatives whose loss is flat (outside the margin), which clamps part of the
# diagonal to zero and leaves the prior variance on weights of features the digits use
# more. They do the same on the MLP of :doc:`/tutorials/plot_3_laplace` post-hoc, but the
# term is not the GGN of the contrastive loss and nothing guarantees it elsewhere: check
# OOD AUROC on held-out data before trusting any u.
#
# Online LAM
# ----------
# Online LAM trains a fresh net with weights drawn from the running posterior (its own
# loss replaces the PML loop). With the hard pairs its u is inverted as well (OOD AUROC
# about 0.02 on this seed); with the defaults it ranks the retrieval errors above chance
# (R-AUROC about 0.60, its interval above 0.5) but not the digits: OOD AUROC about 0.47 on
# this seed, its interval just below 0.5 (the note calls it inverted); over five seeds
# 0.76 [0.55, 0.96] (``results/lam/hessian_pairs/``), so the seed decides.
torch.manual_seed(0)
net_online = make_net()
la_online = MetricLaplace(
    net_online, mode="online", approximation="fixed", geometry="arccos", margin=MARGIN,
    prior_precision=1.0, alpha=0.01, dataset_size=len(y_train),
)  # fmt: skip
opt = torch.optim.Adam(net_online.parameters(), lr=1e-3)
train_online(
    la_online, loader(), opt, epochs=5, generator=torch.Generator().manual_seed(0), progress=False
)
net_online.eval()
with torch.no_grad():
    zo_test, zo_ood = net_online(x_test), net_online(x_ood)
emb_test = nn.functional.normalize(zo_test, dim=1)
results["online 1/||z||"] = score(
    "online net, 1/||z|| (no Laplace)", 1 / zo_test.norm(dim=1), 1 / zo_ood.norm(dim=1)
)
results["online"] = score(
    "online LAM", la_online.predictive(x_test).uncertainty, la_online.predictive(x_ood).uncertainty
)

# %%
# What is trustworthy here: the embeddings (R@1 about 0.83) and, for OOD, the inverse
# norm ``1/||z||`` checked on held-out digits -- LAM's u with the default pairs only as far
# as its OOD AUROC on such data carries it, and no post-hoc u for ranking retrieval errors.
# The checks below keep this page honest: if a change to :mod:`bayesurl.laplace` moves these
# figures out of their ranges, the docs build fails and the text above must be revisited.
if data.name != "fashion_mnist":  # the ranges below were measured on FashionMNIST
    print(f"figures not checked: the data is {data.name!r}, not FashionMNIST")
else:
    assert 0.78 <= results["defaults"]["r@1"] <= 0.90, results["defaults"]["r@1"]
    assert 0.72 <= results["1/||z|| (no Laplace)"]["ood_auroc"] <= 0.92
    for name in ("hard pairs", "training miner (MultiSimilarity)"):
        assert 0.0 <= results[name]["ood_auroc"] <= 0.40, (name, results[name]["ood_auroc"])
    for name in ("defaults", "LAM authors' setting"):
        assert 0.50 <= results[name]["ood_auroc"] <= 0.70, (name, results[name]["ood_auroc"])
    assert 0.35 <= results["online"]["ood_auroc"] <= 0.60, results["online"]["ood_auroc"]
    assert 0.54 <= results["online"]["r_auroc"] <= 0.66, results["online"]["r_auroc"]
    assert rho_gain >= 0.85, rho_gain
    # the words above are what the intervals say
    for name, r in results.items():
        iv = r["intervals"]["ood_auroc"]
        if name in ("hard pairs", "training miner (MultiSimilarity)"):
            assert iv.high < 0.5 and "inverted_ood_auroc" in {n.kind for n in r.caveats}, name
        if name in ("1/||z|| (no Laplace)", "defaults", "LAM authors' setting"):
            assert iv.low > 0.5, (name, iv)
    assert results["online"]["intervals"]["r_auroc"].low > 0.5
    assert results["online"]["intervals"]["ood_auroc"].low < 0.5  # not above chance
