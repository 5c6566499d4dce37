"""
Evaluate your own embeddings
============================

You already have an encoder, and you want to know how good its embeddings *and* its
uncertainties are under the zero-shot protocol of the URL benchmark (Kirchhof et al., 2023,
section 3). :func:`bayesurl.evaluate <bayesurl.evaluation.evaluate>` takes plain tensors --
embeddings, labels, and optionally per-image uncertainties ``u(x)``, posterior samples and the
uncertainties of out-of-distribution images -- and returns every metric from one kNN search.

Here the "encoder" is a random projection of raw FashionMNIST pixels: cheap, and good
enough to have something to measure.
"""

# %%
# Data: the embedded zero-shot default
# ------------------------------------
# :func:`bayesurl.data.default_zero_shot` gives the upstream classes (0-4) for training,
# the unseen downstream classes (5-9) for retrieval, and foreign images (digits) as OOD
# data. It falls back to scikit-learn's digits when FashionMNIST is not installed.
import warnings

import matplotlib.pyplot as plt
import torch

import bayesurl
from bayesurl.data import as_tensors, default_zero_shot
from bayesurl.evaluation import (
    AUSC,
    RAUROC,
    RecallAtK,
    RetrievalECE,
    plot_reliability_diagram,
    plot_sparsification_curve,
)

torch.set_num_threads(1)
torch.manual_seed(0)
with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # the digits fallback warns when FashionMNIST is absent
    data = default_zero_shot(max_train=500, max_test=1000, max_ood=500)
x_test, y_test = as_tensors(data.test)
x_ood, _ = as_tensors(data.ood)
print(data.name, "test:", tuple(x_test.shape), "ood:", tuple(x_ood.shape))

# %%
# Embeddings and an uncertainty
# -----------------------------
# Any ``[N, D]`` tensor works (cosine similarity is used). For ``u(x)`` we take a simple
# heuristic: the inverse norm of the unnormalised embedding -- in vMF-style models a small
# norm means a flat, uncertain distribution (URL section 4.1). Higher ``u`` must mean *less*
# certain.
proj = torch.randn(x_test[0].numel(), 64) / x_test[0].numel() ** 0.5


def encode(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    z = x.flatten(1) @ proj
    return z, 1.0 / z.norm(dim=1)


emb, u = encode(x_test)
_, u_ood = encode(x_ood)
res = bayesurl.evaluate(emb, y_test, uncertainties=u, ood_uncertainties=u_ood)
print(res.describe(["r@1", "r_auroc", "ausc", "ood_auroc", "map@5"]))
for key in ("r@1", "r_auroc", "ood_auroc"):
    print(f"{key:>9s}: {res['intervals'][key].describe()}")
# the docs build checks this page's figures: the projection retrieves well, 1/||z|| ranks
# its failures better than chance (its interval excludes 0.5) -- and the note below it
assert 0.83 <= res["r@1"] <= 0.93, f"R@1 {res['r@1']:.3f} outside [0.83, 0.93]"
assert 0.58 <= res["r_auroc"] <= 0.72, f"R-AUROC {res['r_auroc']:.3f} outside [0.58, 0.72]"
assert res["intervals"]["r_auroc"].low > 0.5, res["intervals"]["r_auroc"]
kinds = {n.kind for n in res.caveats}
assert ("inverted_ood_auroc" in kinds) == (res["intervals"]["ood_auroc"].high < 0.5), kinds

# %%
# Every number above comes with its 95 % interval over the 1,000 queries (and the OOD
# images): ``res["intervals"]`` (Wilson for R@1, DeLong for the AUROCs, a bootstrap for AUSC
# and mAP; :doc:`/concepts/metrics`, "Intervals"). ``res.caveats`` holds the notes a reader
# needs: here 1/||z|| gives the OOD digits a *lower* u than the downstream clothes, an OOD
# AUROC whose interval lies below 0.5 -- the norm heuristic that ranks retrieval failures
# ranks foreign images backwards, and the note says so rather than letting the number read as
# a weak detector.

# %%
# Posterior samples give the calibration error
# --------------------------------------------
# The retrieval ECE of LAM (Warburg et al., 2023, section 5) needs draws of the embedding.
# Here we perturb each embedding with Gaussian noise scaled by its ``u``: a stand-in for a
# real posterior. With ``return_curves=True`` the evaluator also returns the sparsification
# curve and the reliability diagram's bins.
samples = (
    emb
    + 3.0
    * u[None, :, None]
    * emb.norm(dim=1)[None, :, None]
    * torch.randn(16, *emb.shape)
    / emb.shape[1] ** 0.5
)
res = bayesurl.evaluate(
    emb, y_test, uncertainties=u, samples=samples, ood_uncertainties=u_ood, return_curves=True
)
print(res.describe(["ece", "r@1", "r_auroc"], notes=False))
assert res["intervals"]["ece"].method == "bootstrap"  # the draws' per-query pairs, resampled

fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 4), layout="constrained")
sp = res["sparsification"]
plot_sparsification_curve(sp["removed"], sp["r@1"], sp["oracle"], label="1/||z||", ax=ax1)
rel = res["reliability"]
plot_reliability_diagram(rel["bin_edges"], rel["accuracy"], rel["count"], ece=res["ece"], ax=ax2)
plt.show()

# %%
# Metric classes for batched evaluation
# -------------------------------------
# The same metrics exist as torchmetrics classes: ``update`` once per batch, ``compute`` at
# the end (they gather across processes under ``torch.distributed``), and ``plot`` draws the
# matching figure.
r1, rauroc, ausc, ece = RecallAtK(k=1), RAUROC(), AUSC(), RetrievalECE()
for i in range(0, len(y_test), 250):
    sl = slice(i, i + 250)
    r1.update(emb[sl], y_test[sl])
    rauroc.update(emb[sl], y_test[sl], u[sl])
    ausc.update(emb[sl], y_test[sl], u[sl])
    ece.update(samples[:, sl], y_test[sl])
# the classes give the evaluator's numbers; their intervals are the evaluator's
print(
    f"R@1 {float(r1.compute()):.3f}  R-AUROC {float(rauroc.compute()):.3f}  "
    f"AUSC {float(ausc.compute()):.3f}  ECE {float(ece.compute()):.3f}  (intervals: above)"
)
for key, metric in (("r@1", r1), ("r_auroc", rauroc), ("ausc", ausc), ("ece", ece)):
    assert abs(float(metric.compute()) - res[key]) < 1e-6, key
fig, axes = plt.subplots(1, 2, figsize=(9, 4), layout="constrained")
ausc.plot(ax=axes[0])
ece.plot(ax=axes[1])
plt.show()

# %%
# The metrics were computed batch-wise but over *all* images: retrieval metrics need the
# whole gallery, so the classes accumulate and search once in ``compute``. See
# :doc:`/concepts/metrics` for the definitions and :doc:`/concepts/plots` for how to read
# the figures.
