"""
Add uncertainty to a frozen encoder with ``wrap``
=================================================

You have a trained encoder and do not want to touch it: its embeddings are in production,
its index is built. :func:`bayesurl.wrap <bayesurl.posthoc.wrap>` adds an uncertainty
``u(x)`` on top, leaving the embedding bit for bit unchanged. Three post-hoc methods are available:

- ``"pvu"``: pretrained visual uncertainties (Kirchhof, thesis "Uncertainty for pretrained
  representations", section 5.3): a small head trained on cached embeddings to rank the
  encoder's losses;
- ``"tau"``: Temperature as Uncertainty (TaU, section 4): a temperature head trained with the
  SimCLR loss on two views;
- ``"laplace"``: last-layer Laplace of the encoder's final ``nn.Linear`` (LAM, section 3).
"""

# %%
# A trained encoder
# -----------------
# A small MLP trained with cross-entropy on FashionMNIST classes 0-4; its 32-d penultimate
# layer is the embedding. (Any ``nn.Module`` mapping inputs to ``[N, D]`` works, including a
# trained :class:`~bayesurl.methods.Method`.)
import warnings

import matplotlib.pyplot as plt
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import bayesurl
from bayesurl.data import as_tensors, default_transform, default_zero_shot

torch.set_num_threads(1)
torch.manual_seed(0)
with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # the digits fallback warns when FashionMNIST is absent
    data = default_zero_shot(max_train=1500, max_test=800, max_ood=400, val_fraction=0.0)
to_input = default_transform(1)
x_train, y_train = as_tensors(data.train, to_input)
x_test, y_test = as_tensors(data.test, to_input)
x_ood, _ = as_tensors(data.ood, to_input)

encoder = nn.Sequential(nn.Flatten(), nn.Linear(784, 128), nn.ReLU(), nn.Linear(128, 32))
classifier = nn.Linear(32, data.num_train_classes)
opt = torch.optim.Adam([*encoder.parameters(), *classifier.parameters()], lr=1e-3)
train_loader = DataLoader(
    TensorDataset(x_train, y_train),
    batch_size=64,
    shuffle=True,
    generator=torch.Generator().manual_seed(0),
)
for _ in range(5):
    for xb, yb in train_loader:
        loss = nn.functional.cross_entropy(classifier(encoder(xb)), yb)
        opt.zero_grad()
        loss.backward()
        opt.step()
encoder.eval()
with torch.no_grad():
    emb_before = encoder(x_test)

# %%
# Wrap it three times
# -------------------
# Each wrapper has ``fit(loader, ...)``; the encoder stays frozen in eval mode. TaU needs two
# views per image: we pass a light augmentation (noise and a horizontal flip).


def augment(x: torch.Tensor) -> torch.Tensor:
    flip = torch.rand(x.shape[0], 1, 1, 1) < 0.5
    return torch.where(flip, x.flip(-1), x) + 0.1 * torch.randn_like(x)


wrapped = {
    "pvu": bayesurl.wrap(encoder, "pvu", classifier=classifier, embed_dim=32),
    "tau": bayesurl.wrap(encoder, "tau"),
    "laplace": bayesurl.wrap(encoder, "laplace"),
}
wrapped["pvu"].fit(train_loader, epochs=5, lr=1e-3, progress=False)
wrapped["tau"].fit(train_loader, epochs=3, lr=1e-2, augment=augment, progress=False)
wrapped["laplace"].fit(train_loader, progress=False)

results, u_test, u_ood = {}, {}, {}
with torch.no_grad():
    for name, w in wrapped.items():
        emb, u = w(x_test)
        assert torch.equal(emb, emb_before)  # the embedding is untouched
        u_test[name], u_ood[name] = u, w(x_ood).uncertainty
        results[name] = res = bayesurl.evaluate(
            emb, y_test, uncertainties=u, ood_uncertainties=u_ood[name]
        )
        # each metric with its 95 % interval over the queries, then the notes on this u
        print(f"{name:8s} {res.describe(['r@1', 'r_auroc', 'ood_auroc'])}")
# the docs build checks the figures of this page: the frozen encoder retrieves well and PVU's
# u ranks its failures better than chance
assert 0.75 <= results["pvu"]["r@1"] <= 0.88, f"R@1 {results['pvu']['r@1']:.3f}"
assert 0.55 <= results["pvu"]["r_auroc"] <= 0.70, f"R-AUROC {results['pvu']['r_auroc']:.3f}"
assert results["pvu"]["intervals"]["r_auroc"].low > 0.5  # beyond the queries' noise
# a u whose OOD AUROC interval lies below 0.5 carries the "inverted" note, printed above
for n, res in results.items():
    inverted = res["intervals"]["ood_auroc"].high < 0.5
    assert ("inverted_ood_auroc" in {c.kind for c in res.caveats}) == inverted, n

# %%
# Compare
# -------
# R@1 is the same for all three (same embeddings); what differs is how well ``u(x)`` ranks
# the retrieval failures (R-AUROC) and separates foreign images (OOD AUROC). Left: both
# AUROCs with their 95 % intervals; a bar whose interval reaches below the dashed line is a u
# at chance or inverted there -- the notes printed above name each one (post-hoc u fitted on
# the upstream classes need not rank foreign images right). Right: the distribution of each
# ``u`` on test and OOD images, on a rank scale so that they compare.
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4), layout="constrained")
names = list(results)
pos = torch.arange(len(names), dtype=torch.float64)


def bars(key: str) -> tuple[list[float], list[list[float]]]:
    """The AUROC of each wrapper and its interval as error-bar lengths."""
    v = [results[n][key] for n in names]
    ivs = [results[n]["intervals"][key] for n in names]
    return v, [[x - iv.low for x, iv in zip(v, ivs)], [iv.high - x for x, iv in zip(v, ivs)]]


for shift, key, label in ((-0.2, "r_auroc", "R-AUROC"), (0.2, "ood_auroc", "OOD AUROC")):
    v, err = bars(key)
    ax1.bar(pos + shift, v, 0.4, yerr=err, capsize=3, label=label)
ax1.axhline(0.5, color="k", lw=0.8, ls="--")
ax1.set_xticks(pos.tolist(), names)
ax1.set(ylim=(0, 1), title="post-hoc u(x) on a frozen encoder")
ax1.legend()
for i, n in enumerate(names):
    both = torch.cat([u_test[n], u_ood[n]])
    ranks = both.argsort().argsort().double() / (len(both) - 1)
    ax2.violinplot(
        [ranks[: len(u_test[n])].numpy(), ranks[len(u_test[n]) :].numpy()],
        positions=[2 * i, 2 * i + 0.8],
        showmedians=True,
    )
ax2.set_xticks([2 * i + 0.4 for i in range(len(names))], names)
ax2.set(ylabel="rank of u (0 = most certain)", title="u(x): test (left) vs OOD (right)")
plt.show()

# %%
# Save and reload a wrapper (``weights_only=True`` under the hood)::
#
#    wrapped["pvu"].save("pvu.pt")
#    again = bayesurl.posthoc.load("pvu.pt", encoder)
#
# From the command line: ``bayesurl wrap runs/ce/last.pt --method pvu --out runs/ce/pvu.pt``.
