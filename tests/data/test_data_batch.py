"""The one batch reader, :func:`bayesurl.data.unpack_batch`, and its callers."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

from bayesurl.data import unpack_batch
from bayesurl.data.batch import INPUT_KEYS, LABEL_KEYS


def _x(n=4, shape=(1, 3, 3), seed=0):
    return torch.randn(n, *shape, generator=torch.Generator().manual_seed(seed))


# -- every accepted form, read by hand ----------------------------------------------------------
def test_accepted_forms_by_hand():
    x, y = _x(), torch.tensor([0, 1, 0, 1])
    x2 = _x(seed=1)
    got_x, got_y = unpack_batch(x)
    assert got_x is x and got_y is None
    got_x, got_y = unpack_batch((x,))
    assert got_x is x and got_y is None
    for container in (tuple, list):
        got_x, got_y = unpack_batch(container([x, y]))
        assert got_x is x and got_y is y
        got_x, got_y = unpack_batch(container([(x, x2), y]))
        assert got_x[0] is x and got_x[1] is x2 and got_y is y
    got_x, got_y = unpack_batch((x, None))
    assert got_x is x and got_y is None
    # labels as a Python list (a custom collate) become a tensor
    got_x, got_y = unpack_batch((x, [0, 1, 0, 1]))
    assert got_x is x and torch.equal(got_y, y)
    # a dict with one input key and one label key
    got_x, got_y = unpack_batch({"image": x, "label": y})
    assert got_x is x and got_y is y
    got_x, got_y = unpack_batch({"pixel_values": x})
    assert got_x is x and got_y is None
    # a bare view pair is two views only where the caller says so
    (a, b), got_y = unpack_batch((x, x2), views=True)
    assert a is x and b is x2 and got_y is None


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 6),
    form=st.sampled_from(["tensor", "single", "pair", "views", "dict"]),
    container=st.sampled_from([tuple, list]),
    label_kind=st.sampled_from(["tensor", "list", "none"]),
    xkey=st.sampled_from(INPUT_KEYS),
    ykey=st.sampled_from(LABEL_KEYS),
)
def test_round_trip_property(n, form, container, label_kind, xkey, ykey):
    # the reader hands back the very objects it was given (no copy, no device move), and the
    # labels' values, whatever container carries them
    x, x2 = _x(n), _x(n, seed=1)
    labels = list(range(n))
    y = {"tensor": torch.tensor(labels), "list": labels, "none": None}[label_kind]
    if form in ("tensor", "single"):
        y = None
    batch = {
        "tensor": x,
        "single": container([x]),
        "pair": container([x, y]),
        "views": container([container([x, x2]), y]),
        "dict": {xkey: x, **({} if y is None else {ykey: y})},
    }[form]
    got_x, got_y = unpack_batch(batch)
    if form == "views":
        assert got_x[0] is x and got_x[1] is x2
    else:
        assert got_x is x
    if y is None:
        assert got_y is None
    else:
        assert got_y.tolist() == labels
        if isinstance(y, torch.Tensor):
            assert got_y is y


def test_real_loader_batches():
    x, y = _x(6), torch.arange(6) % 2
    (b,) = list(DataLoader(TensorDataset(x, y), batch_size=6))
    got_x, got_y = unpack_batch(b)  # default collate yields a list [x, y]
    assert torch.equal(got_x, x) and torch.equal(got_y, y)

    class Dicts(Dataset):
        def __len__(self):
            return 6

        def __getitem__(self, i):
            return {"image": x[i], "label": int(y[i])}

    (b,) = list(DataLoader(Dicts(), batch_size=6))
    got_x, got_y = unpack_batch(b)
    assert torch.equal(got_x, x) and torch.equal(got_y, y)

    class Views(Dataset):
        def __len__(self):
            return 6

        def __getitem__(self, i):
            return (x[i], -x[i]), int(y[i])

    (b,) = list(DataLoader(Views(), batch_size=6))
    (v1, v2), got_y = unpack_batch(b)
    assert torch.equal(v1, x) and torch.equal(v2, -x) and torch.equal(got_y, y)


# -- bad batches ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("batch", "match"),
    [
        ((_x(), torch.arange(4), torch.arange(4)), "cannot read `batch`.*tuple of length 3"),
        ((), "cannot read `batch`"),
        ("abc", "cannot read `batch`.*str"),
        ((_x(), _x(seed=1)), "ambiguous `batch`"),
        ((_x(), torch.arange(3)), "length mismatch.*`x` has 4.*`y` has 3"),
        (((_x(), "abc"), torch.arange(4)), r"the inputs of `batch`.*tuple of length 2"),
        ((((_x(), _x(), _x())), torch.arange(4)), r"the inputs of `batch`"),
        (([1, 2, 3], torch.arange(3)), r"the inputs of `batch`.*list"),
        ((_x(), torch.tensor(1)), "labels `y` of `batch`.*scalar"),
        ((_x(), "abc"), "labels of `batch`"),
        ({"image": _x(), "x": _x()}, r"dict with keys \['image', 'x'\]"),
        ({"image": _x(), "label": torch.arange(4), "index": 3}, r"'index'"),
        ({"label": torch.arange(4)}, "exactly one input key"),
    ],
)
def test_bad_batches_fail_clearly(batch, match):
    with pytest.raises(ValueError, match=match):
        unpack_batch(batch)


def test_views_pair_needs_tensors_and_labels_flag():
    # (x1, x2) with x2 of another length is not two views (mismatched rows): x and labels y
    x = _x()
    with pytest.raises(ValueError, match="length mismatch"):
        unpack_batch((x, _x(3)), views=True)
    with pytest.raises(ValueError, match=r"`batch` must be a pair \(x, y\) with labels"):
        unpack_batch(x, labels=True)
    with pytest.raises(ValueError, match=r"`loader batch` must be a pair"):
        unpack_batch({"x": x}, labels=True, name="loader batch")


# -- one reader behind every loader consumer ----------------------------------------------------
def _triples():
    x = _x(8, (6,))
    return [(x, torch.arange(8) % 2, torch.arange(8))]


def test_every_consumer_reads_batches_the_same_way():
    from bayesurl.laplace import MetricLaplace
    from bayesurl.methods.base import Method
    from bayesurl.posthoc import wrap
    from bayesurl.training import fit

    class LinearCE(Method):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(6, 2)

        def training_loss(self, batch):
            x, y = batch
            return nn.functional.cross_entropy(self.linear(x), y)

    bad = "cannot read `batch`.*tuple of length 3"
    with pytest.raises(ValueError, match=bad):
        fit(LinearCE(), _triples(), progress=False)
    model = nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 4))
    with pytest.raises(ValueError, match=bad):
        MetricLaplace(model, mode="posthoc").fit(_triples(), progress=False)
    enc = nn.Linear(6, 4)
    with pytest.raises(ValueError, match=bad):
        wrap(enc, "pvu", embed_dim=4).fit(_triples(), cached=False, progress=False)
    with pytest.raises(ValueError, match=bad):
        wrap(enc, "tau", embed_dim=4).fit(_triples(), progress=False)
    # a dict batch is read by the training loop as (x, y)
    x, y = _x(8, (6,)), torch.arange(8) % 2
    m = LinearCE()
    res = fit(m, [{"inputs": x, "targets": y}], epochs=1, progress=False)
    assert len(res.history) == 1
