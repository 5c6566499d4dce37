"""Registry and the Method contract for the classifier-style methods: discovery, unknown names,
shapes, u > 0, loss decrease in a few CPU steps, JSON hparams rebuild, bad input."""

import json

import pytest
import torch

import bayesurl.methods as methods
from bayesurl.methods.base import Method

CLASSIFIER_METHODS = ["ce", "ensemble", "hetxl", "losspred", "mcdropout", "sngp"]
VMF_METHODS = ["elk", "hib", "infonce", "mcinfonce", "nivmf"]
#: LAM eq. 1 and its MC-dropout variant (tests/methods/test_contrastive.py)
CONTRASTIVE_METHODS = ["contrastive", "contrastive_mcdropout"]
TINY = {"embed_dim": 16, "num_classes": 3, "backbone_kwargs": {"num_features": 24, "width": 8}}


@pytest.fixture(autouse=True)
def _one_thread():
    # intra-op threads only add contention for tensors this small
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _data(n=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % 3
    # class-dependent brightness so that a few steps can fit the batch
    x = torch.randn(n, 1, 28, 28, generator=g) * 0.5 + y.view(-1, 1, 1, 1).float()
    return x, y


def _make(name, **kw):
    torch.manual_seed(0)
    return methods.create(name, **{**TINY, **kw})


def test_available_lists_the_classifier_methods():
    names = methods.available()
    # the eleven URL methods (URL section 4.1), joint TaU (TaU Algorithm 1) and LAM's
    # contrastive baselines (LAM eq. 1, Table 2)
    expected = set(CLASSIFIER_METHODS) | set(VMF_METHODS) | set(CONTRASTIVE_METHODS) | {"tau"}
    assert set(names) == expected
    assert names == sorted(names)
    for name in names:
        cls = methods.get(name)
        assert issubclass(cls, Method) and cls.name == name
    assert methods.get("HetXL") is methods.get("hetxl")  # case-insensitive


def test_unknown_name_lists_valid_names():
    with pytest.raises(ValueError, match="unknown method 'nope'") as info:
        methods.create("nope")
    for name in CLASSIFIER_METHODS + VMF_METHODS:
        assert name in str(info.value)


@pytest.mark.parametrize("name", CLASSIFIER_METHODS)
def test_forward_shapes_and_positive_uncertainty(name):
    m = _make(name).eval()
    x, _ = _data(5)
    cls = type(m)
    assert cls.supervised and not cls.two_view
    with torch.no_grad():
        out = m(x, n_samples=3)
    assert out.embedding.shape == (5, 16)
    assert out.uncertainty.shape == (5,)
    assert torch.isfinite(out.uncertainty).all() and bool((out.uncertainty > 0).all())
    assert out.logits.shape == (5, 3) and torch.isfinite(out.logits).all()
    if cls.has_distribution:
        assert out.samples.shape == (3, 5, 16)
        assert m(x).samples is None
    else:
        assert out.samples is None


@pytest.mark.parametrize("name", CLASSIFIER_METHODS)
def test_training_loss_decreases_in_a_few_steps(name):
    m = _make(name)
    batch = _data()
    m.on_epoch_start(0)

    def measure():
        torch.manual_seed(123)  # same MC / dropout noise for both measurements
        with torch.no_grad():
            return float(m.training_loss(batch))

    m.train()
    before = measure()
    opt = torch.optim.Adam(m.parameters(), lr=3e-3)
    for _ in range(15):
        opt.zero_grad()
        loss = m.training_loss(batch)
        assert loss.ndim == 0 and torch.isfinite(loss)
        loss.backward()
        opt.step()
    after = measure()
    m.on_epoch_end(0)
    assert after < 0.8 * before, (before, after)


@pytest.mark.parametrize("name", CLASSIFIER_METHODS)
def test_dtype_follows_the_module_and_inputs(name):
    m = _make(name).double().eval()
    x, y = _data(4)
    out = m(x.double(), n_samples=2)
    for t in (out.embedding, out.uncertainty, out.logits, out.samples):
        assert t is None or t.dtype == torch.float64
    m.train()
    m.on_epoch_start(0)
    assert m.training_loss((x.double(), y)).dtype == torch.float64
    m.on_epoch_end(0)


@pytest.mark.parametrize("name", CLASSIFIER_METHODS)
def test_hparams_are_json_and_rebuild_the_method(name):
    m = _make(name).eval()
    hp = json.loads(json.dumps(m.hparams))
    m2 = methods.create(name, **hp).eval()
    m2.load_state_dict(m.state_dict())
    x, _ = _data(4)
    torch.manual_seed(5)
    a = m(x)
    torch.manual_seed(5)
    b = m2(x)
    torch.testing.assert_close(a.embedding, b.embedding)
    torch.testing.assert_close(a.uncertainty, b.uncertainty)
    torch.testing.assert_close(a.logits, b.logits)


@pytest.mark.parametrize("name", CLASSIFIER_METHODS)
def test_bad_input_fails_clearly(name):
    m = _make(name)
    x, y = _data(4)
    with pytest.raises(ValueError, match="`x`"):
        m(torch.full_like(x, float("nan")))
    with pytest.raises(ValueError, match="`x`"):
        m(torch.randn(4, 3, 28, 28))  # wrong channel count for the backbone
    with pytest.raises(ValueError, match="`x`"):
        m(torch.randn(0, 1, 28, 28))
    with pytest.raises(ValueError, match="length mismatch"):
        m.training_loss((x, y[:3]))
    with pytest.raises(ValueError, match="`y`"):
        m.training_loss((x, torch.tensor([0, 1, 2, 3])))
    with pytest.raises(ValueError, match="`y`"):
        m.training_loss((x, y.float()))
    with pytest.raises(ValueError, match="n_samples"):
        m(x, n_samples=-1)
    with pytest.raises(ValueError, match="num_classes"):
        methods.create(name, num_classes=1)


def test_any_backbone_module_and_timm_name():
    class Flat(torch.nn.Module):
        num_features = 20

        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(6, 20)

        def forward(self, x):
            return self.lin(x)

    for name in CLASSIFIER_METHODS:
        m = methods.create(name, backbone=Flat(), embed_dim=None, num_classes=4).eval()
        out = m(torch.randn(3, 6))
        assert out.embedding.shape == (3, 20) and out.logits.shape == (3, 4)
        assert m.hparams["backbone"] == "<module Flat>"
    m = methods.create("ce", backbone="resnet18", embed_dim=8, num_classes=3).eval()
    with torch.no_grad():
        assert m(torch.randn(2, 3, 32, 32)).embedding.shape == (2, 8)
