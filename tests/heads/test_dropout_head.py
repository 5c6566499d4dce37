"""Head-only MC dropout: stochastic passes, masks, eval determinism."""

import pytest
import torch

from bayesurl.heads.dropout import MCDropoutHead


@pytest.fixture(autouse=True)
def _one_thread():
    # intra-op threads only add contention for tensors this small
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def test_eval_passes_differ_and_follow_the_dropout_formula():
    torch.manual_seed(0)
    head = MCDropoutHead(16, 3, p=0.25).double().eval()
    e = torch.randn(4, 16, dtype=torch.float64)
    logits, dropped = head.sample(e, 6)
    assert logits.shape == (6, 4, 3) and dropped.shape == (6, 4, 16)
    for s in range(1, 6):
        assert not torch.allclose(logits[0], logits[s])
    # every unit is either dropped or scaled by 1 / (1 - p)
    kept = dropped != 0
    torch.testing.assert_close(dropped[kept], (e.expand_as(dropped) / 0.75)[kept])
    for s in range(6):
        torch.testing.assert_close(
            logits[s], dropped[s] @ head.classifier.weight.T + head.classifier.bias
        )
    # eval forward is the deterministic mean network
    torch.testing.assert_close(head(e), e @ head.classifier.weight.T + head.classifier.bias)
    assert head.training is False


def test_dropout_rate_and_unbiasedness():
    torch.manual_seed(1)
    head = MCDropoutHead(50, 2, p=0.2)
    e = torch.randn(10, 50)
    _, dropped = head.sample(e, 2000)
    frac = float((dropped == 0).float().mean())
    assert abs(frac - 0.2) < 0.01  # 1e6 Bernoulli draws, sd 4e-4
    torch.testing.assert_close(dropped.mean(0), e, rtol=0, atol=0.15)


def test_training_forward_drops_units():
    torch.manual_seed(2)
    head = MCDropoutHead(16, 3, p=0.5).train()
    e = torch.randn(4, 16)
    assert not torch.allclose(head(e), head(e))


def test_bad_input():
    with pytest.raises(ValueError, match="p"):
        MCDropoutHead(4, 3, p=1.0)
    head = MCDropoutHead(4, 3)
    with pytest.raises(ValueError, match="embedding"):
        head.sample(torch.randn(2, 5))
    with pytest.raises(ValueError, match="n_passes"):
        head.sample(torch.randn(2, 4), 0)
