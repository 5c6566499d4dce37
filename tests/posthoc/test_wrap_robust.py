"""Regressions for the post-hoc wrappers: the embedding width comes from what the
encoder returns (a timm classifier included), a fit that could not train raises, and a
wrapper that was never fitted refuses to predict."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from bayesurl.posthoc import load, wrap

pytestmark = [
    pytest.mark.filterwarnings("ignore:Full backward hook:UserWarning"),
    pytest.mark.filterwarnings("ignore:By default `link_approx`:UserWarning"),
    pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:FutureWarning"),
]


def _enc(dim=6):
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(16, 12), nn.ReLU(), nn.Linear(12, dim))


def _labelled(n_batches=3, batch=16, classes=3, shape=(1, 4, 4), seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n_batches):
        y = torch.arange(batch) % classes
        x = torch.randn(batch, *shape, generator=g) + y.view(-1, *([1] * len(shape))).float()
        out.append((x, y))
    return out


def _views(n_batches=2, batch=8, shape=(1, 4, 4), seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n_batches):
        x = torch.randn(batch, *shape, generator=g)
        out.append(((x + 0.1 * torch.randn(x.shape, generator=g), x), torch.zeros(batch).long()))
    return out


@pytest.mark.parametrize("method", ["pvu", "tau"])
def test_timm_classifier_width_comes_from_its_output(method, tmp_path):
    timm = pytest.importorskip("timm")
    model = timm.create_model("resnet18", num_classes=16, pretrained=False)
    assert model.num_features == 512  # the width before the head: not the embedding
    w = wrap(model, method, hidden=8) if method == "pvu" else wrap(model, method)
    assert w.head is None  # built from the first embeddings the model returns
    shape = (3, 32, 32)
    if method == "pvu":
        w.fit(_labelled(2, 8, 4, shape), cached=False, progress=False)
    else:
        w.fit(_views(2, 4, shape), progress=False)
    assert w.head.in_features == 16
    x = torch.randn(4, *shape)
    with torch.no_grad():
        emb, u = w(x)
    assert emb.shape == (4, 16) and u.shape == (4,) and torch.isfinite(u).all()
    w.save(tmp_path / "w.pt")
    again = load(tmp_path / "w.pt", model)  # num_features = 512 is not read
    with torch.no_grad():
        assert torch.equal(again(x).uncertainty, u)


@pytest.mark.parametrize("cached", [True, False])
def test_pvu_fit_that_cannot_train_raises(cached):
    enc = _enc()
    kw = {"cached": cached, "progress": False}
    with pytest.raises(ValueError, match="no data|could not train|empty"):
        wrap(enc, "pvu", hidden=8).fit([], **kw)
    # batches of one image: no pair to rank
    ones = [(x[:1], y[:1]) for x, y in _labelled()]
    with pytest.raises(ValueError, match="could not train"):
        wrap(enc, "pvu", hidden=8).fit(ones, batch_size=1, **kw)
    # no repeated label within a batch: supervised contrastive has no positive
    distinct = [(x[:3], torch.arange(3) + 3 * i) for i, (x, _) in enumerate(_labelled())]
    with pytest.raises(ValueError, match="could not train.*repeated label"):
        wrap(enc, "pvu", hidden=8).fit(distinct, batch_size=3, **kw)
    w = wrap(enc, "pvu", hidden=8)
    with pytest.raises(ValueError, match="not fitted"):
        w(torch.randn(2, 1, 4, 4))


def test_pvu_temperature_must_be_positive():
    for bad in (0.0, -1.0, math.nan, math.inf):
        with pytest.raises(ValueError, match="`temperature`"):
            wrap(_enc(), "pvu", temperature=bad)
    with pytest.raises(ValueError, match="`embed_dim`"):
        wrap(_enc(), "pvu", embed_dim=2.5)
    with pytest.raises(TypeError, match="`embed_dim`"):
        wrap(_enc(), "pvu", embed_dim="8")


def test_tau_fit_that_cannot_train_raises():
    with pytest.raises(ValueError, match="no data"):
        wrap(_enc(), "tau").fit([], progress=False)
    singles = [((v1[:1], v2[:1]), y[:1]) for (v1, v2), y in _views()]
    with pytest.raises(ValueError, match="single image"):
        wrap(_enc(), "tau").fit(singles, progress=False)
    # a trailing batch of one is skipped, the rest trains
    w = wrap(_enc(), "tau")
    out = w.fit(_views() + singles[:1], progress=False)
    assert w.fitted and all(math.isfinite(v) for v in out["losses"])


def test_laplace_before_fit_and_nan_images():
    w = wrap(_enc(), "laplace")
    x = torch.randn(4, 1, 4, 4)
    with pytest.raises(ValueError, match="not fitted"):
        w(x)  # was: u of the prior alone
    with pytest.raises(ValueError, match="not fitted"):
        w.sample(x, 2)
    x[1, 0, 2, 2] = math.nan
    with pytest.raises(ValueError, match="`x` contains non-finite"):
        w(x)  # was: "not the output of its last nn.Linear"


def test_float64_batches_into_pvu_and_tau():
    w = wrap(_enc(), "pvu", hidden=8)
    w.fit(_labelled(), cached=False, progress=False)
    x = torch.randn(5, 1, 4, 4, dtype=torch.float64)
    w.encoder.double()
    with torch.no_grad():
        emb, u = w(x)
    assert emb.dtype == u.dtype == torch.float64 and torch.isfinite(u).all()
    # and fitting on float64 batches
    w2 = wrap(_enc().double(), "pvu", hidden=8)
    w2.fit([(x.double(), y) for x, y in _labelled()], cached=False, progress=False)
    assert w2.fitted
    t = wrap(_enc().double(), "tau")
    t.fit([((a.double(), b.double()), y) for (a, b), y in _views()], progress=False)
    with torch.no_grad():
        assert t(x).uncertainty.dtype == torch.float64


def test_unfitted_state_round_trips(tmp_path):
    w = wrap(_enc(), "pvu", hidden=8, embed_dim=6)
    w.save(tmp_path / "w.pt")
    again = load(tmp_path / "w.pt", _enc())
    assert not again.fitted
    with pytest.raises(ValueError, match="not fitted"):
        again(torch.randn(2, 1, 4, 4))


class _Opaque(nn.Module):
    """An encoder whose output width its type does not tell (no final nn.Linear)."""

    def __init__(self, dim):
        super().__init__()
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(16, dim), nn.ReLU())

    def forward(self, x):
        return self.body(x)


@pytest.mark.parametrize("method", ["tau", "pvu"])
def test_saved_wrapper_refuses_an_encoder_of_another_width_at_load(tmp_path, method):
    data = _labelled()
    kw = {"classifier": nn.Linear(6, 3)} if method == "pvu" else {}
    fit = {"augment": lambda x: x + 0.05 * torch.randn_like(x)} if method == "tau" else {}
    w = wrap(_Opaque(6), method, **kw)
    w.fit(data, progress=False, **fit)
    w.save(tmp_path / "w.pt")
    again = {"classifier": nn.Linear(8, 3)} if method == "pvu" else {}
    with pytest.raises(ValueError, match="fitted on 6-dim embeddings, the encoder returns 8"):
        load(tmp_path / "w.pt", _Opaque(8), **again)
    assert load(tmp_path / "w.pt", _Opaque(6), **kw).input_shape == (1, 4, 4)


def test_save_under_a_missing_folder_creates_it_and_a_folder_path_is_refused(tmp_path):
    w = wrap(_enc(), "laplace")
    w.fit(_labelled(), progress=False)
    w.save(tmp_path / "new" / "deeper" / "w.pt")
    assert load(tmp_path / "new" / "deeper" / "w.pt", _enc()).fitted
    with pytest.raises(ValueError, match="`path` .* is a folder"):
        w.save(tmp_path / "new")
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="`path` .* is a file, not a folder"):
        w.save(tmp_path / "file" / "w.pt")


@pytest.mark.parametrize("method", ["pvu", "laplace", "tau"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.int64])
def test_one_dtype_rule_in_every_posthoc_fit(method, dtype):
    """Floating input is cast to the encoder's dtype; integer input the encoder cannot take is
    a TypeError naming `x` (not torch's dtype message from pvu's cache)."""
    data = [
        ((x.to(dtype) if dtype.is_floating_point else (x * 10).to(dtype)), y)
        for x, y in _labelled()
    ]
    if method == "tau":
        data = [((x, x.flip(0).flip(0)), y) for x, y in data]
    kw = {"classifier": nn.Linear(6, 3)} if method == "pvu" else {}
    w = wrap(_enc(), method, **kw)
    if not dtype.is_floating_point:
        with pytest.raises(TypeError, match=r"cannot take the torch.int64 `x`.*floating-point"):
            w.fit(data, progress=False)
        return
    w.fit(data, progress=False)
    x = data[0][0][0] if method == "tau" else data[0][0]
    out = w(x)
    assert out.embedding.dtype == torch.float32 and torch.isfinite(out.uncertainty).all()
    want = _enc()(x.float())
    torch.testing.assert_close(out.embedding, want, atol=5e-3, rtol=5e-3)
