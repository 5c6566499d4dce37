"""Head-only MCDropout (URL B.11): one backbone pass, different logits per pass in eval mode,
pooled predictive and JSD against brute force."""

import pytest
import scipy.stats
import torch

from bayesurl.methods.mcdropout import MCDropout


@pytest.fixture(autouse=True)
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


class CountingFlat(torch.nn.Module):
    num_features = 10

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(6, 10)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return torch.tanh(self.lin(x))


@pytest.mark.parametrize("uncertainty", ["entropy", "jsd"])
def test_eval_forward_runs_backbone_once_and_passes_differ(uncertainty):
    torch.manual_seed(0)
    backbone = CountingFlat()
    m = MCDropout(backbone, embed_dim=8, num_classes=3, p=0.3, uncertainty=uncertainty)
    m = m.double().eval()
    passes = []
    m.head.classifier.register_forward_hook(lambda mod, inp, out: passes.append(out.detach()))
    x = torch.randn(5, 6, dtype=torch.float64)
    out = m(x)
    assert backbone.calls == 1
    logits = passes[0]
    assert logits.shape == (10, 5, 3)
    assert all(not torch.allclose(logits[0], logits[s]) for s in range(1, 10))
    probs = torch.softmax(logits, -1).numpy()
    mean = probs.mean(0)
    torch.testing.assert_close(out.logits.exp().detach(), torch.from_numpy(mean))
    ref = scipy.stats.entropy(mean, axis=-1)
    if uncertainty == "jsd":
        ref = ref - scipy.stats.entropy(probs, axis=-1).mean(0)
    torch.testing.assert_close(out.uncertainty.detach(), torch.from_numpy(ref))
    assert bool((out.uncertainty > 0).all())


def test_samples_are_dropped_embeddings():
    torch.manual_seed(1)
    m = MCDropout(CountingFlat(), embed_dim=8, num_classes=3, p=0.25).double().eval()
    out = m(torch.randn(4, 6, dtype=torch.float64), n_samples=7)
    assert out.samples.shape == (7, 4, 8)
    kept = out.samples != 0
    scaled = (out.embedding / 0.75).expand_as(out.samples)
    torch.testing.assert_close(out.samples[kept], scaled[kept])
    assert bool((~kept).any())


def test_training_loss_is_one_dropout_pass_and_deterministic_in_eval():
    torch.manual_seed(2)
    m = MCDropout(CountingFlat(), embed_dim=8, num_classes=3, p=0.5).double()
    x, y = torch.randn(6, 6, dtype=torch.float64), torch.arange(6) % 3
    m.train()
    assert not torch.allclose(m.training_loss((x, y)), m.training_loss((x, y)))
    m.eval()
    e = m.net(x)
    ref = torch.nn.functional.cross_entropy(m.head.classifier(e), y)
    torch.testing.assert_close(m.training_loss((x, y)), ref)
