"""
Train MCInfoNCE vs CE and compare
=================================

The URL benchmark (Kirchhof et al., 2023) compares uncertainty methods by two numbers: how
well the embeddings retrieve unseen classes (R@1) and how well ``u(x)`` predicts the
retrieval errors (R-AUROC), plotted against each other in its figure 2. This tutorial trains
two of its eleven methods on the same backbone and data:

- ``ce``: a cross-entropy classifier, with the entropy of its softmax as ``u(x)``;
- ``mcinfonce``: MCInfoNCE (Kirchhof et al., 2023, "Probabilistic contrastive learning
  recovers the correct aleatoric uncertainty", section 3), a self-supervised vMF method
  trained on two augmented views, with ``u(x) = 1/kappa(x)``.

The run is tiny (a few hundred steps on CPU): the numbers show the mechanics, not the
benchmark's verdict -- see :doc:`/concepts/which_method` for the measured table.
"""

# %%
# Data and loaders
# ----------------
import warnings

import matplotlib.pyplot as plt
import torch
from torch.utils.data import DataLoader, TensorDataset

import bayesurl.methods
from bayesurl.data import as_tensors, default_augmentation, default_transform, default_zero_shot
from bayesurl.evaluation import evaluate_output, plot_recall_vs_rauroc
from bayesurl.training import FitOptions, fit

torch.set_num_threads(1)
with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # the digits fallback warns when FashionMNIST is absent
    data = default_zero_shot(max_train=1000, max_test=600, max_ood=300, val_fraction=0.0)
to_input = default_transform(1)  # [0, 1] -> standardised, as the training augmentation
x_train, y_train = as_tensors(data.train)
x_test, y_test = as_tensors(data.test, to_input)
x_ood, _ = as_tensors(data.ood, to_input)
print(f"{data.name}: {len(y_train)} training images of classes {data.upstream_classes}")

# %%
# Train both methods with :func:`bayesurl.training.fit`
# -----------------------------------------------------
# :func:`bayesurl.methods.create` builds a method by name; every method follows the same
# :class:`~bayesurl.methods.Method` contract, so one training loop serves all. For two-view
# methods (``method.two_view``) ``fit`` draws two augmentations of each batch. The settings
# are one :class:`~bayesurl.training.FitOptions`, checked when built; a keyword of ``fit``
# replaces one of its fields for that call (here the augmentation of each method).
settings = FitOptions(epochs=3, optimizer="adamw", lr=3e-3, seed=0, progress=False)
results, curves = {}, {}
for name in ("ce", "mcinfonce"):
    torch.manual_seed(0)
    method = bayesurl.methods.create(
        name, backbone="small_convnet", embed_dim=32, num_classes=data.num_train_classes
    )
    loader = DataLoader(
        TensorDataset(x_train, y_train),
        batch_size=128,
        shuffle=True,
        drop_last=True,
        generator=torch.Generator().manual_seed(0),
    )
    augment = default_augmentation(1) if method.two_view else default_transform(1)
    trained = fit(method, loader, settings, augment=augment)
    curves[name] = trained.losses
    method.eval()
    with torch.no_grad():
        out = method(x_test)
        ood = method(x_ood)
    results[name] = res = evaluate_output(out, y_test, ood)
    # each metric with its 95 % interval over the 1,000 queries, then the notes (an AUROC at
    # chance or inverted by its interval)
    shown = res.describe(["r@1", "r_auroc", "ood_auroc", "ece"])
    print(f"{name} ({trained.train_time:.1f} s): {shown}")
    assert all(f"note: {n.text}" in shown for n in res.caveats)  # the notes are printed
    # the docs build checks the figure of this page: three epochs on 1,000 images learn
    # embeddings that retrieve unseen classes well above chance (0.2 for five classes)
    r1 = results[name]["r@1"]
    assert 0.65 <= r1 <= 0.82, f"{name}: R@1 {r1:.3f} outside [0.65, 0.82]"
    assert res["intervals"]["r@1"].low > 0.2  # above chance beyond the queries' noise

# %%
# Compare
# -------
# Left: the training losses (different losses, so only their shapes compare). Right: R@1
# against R-AUROC, one point per method, as in figure 2 of the URL paper -- up and to the
# right is better on both axes. The bars are the 95 % intervals over the 1,000 queries: two
# methods whose bars overlap are not told apart by this run, and a bar across the dashed
# line (0.5) is a u at chance, which the notes above name.
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4), layout="constrained")
for name, losses in curves.items():
    ax1.plot(losses, label=name)
ax1.set_xlabel("optimiser step")
ax1.set_ylabel("training loss")
ax1.legend()
plot_recall_vs_rauroc(results, ax=ax2)
plt.show()

# %%
# To run the same comparison from the command line, with every method and checkpoints::
#
#    bayesurl train --method mcinfonce --dataset fashion_mnist --epochs 10 --out runs/mcinfonce
#    bayesurl benchmark --preset quick --out runs/benchmark
