"""Ensemble heads and the averaged softmax against brute-force loops (float64)."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from bayesurl.heads.ensemble import EnsembleHeads, average_log_probs
from bayesurl.uncertainty import jensen_shannon


@pytest.fixture(autouse=True)
def _one_thread():
    # intra-op threads only add contention for tensors this small
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def test_heads_are_independent_linear_maps():
    torch.manual_seed(0)
    heads = EnsembleHeads(6, 3, num_heads=4).double()
    e = torch.randn(5, 6, dtype=torch.float64)
    out = heads(e)
    assert out.shape == (4, 5, 3)
    for k in range(4):
        w, b = heads.head(k)
        for n in range(5):
            torch.testing.assert_close(out[k, n], w @ e[n] + b)
    assert not torch.allclose(out[0], out[1])


def test_average_log_probs_and_jsd_match_brute_force():
    logits = torch.randn(4, 5, 3, dtype=torch.float64) * 3
    avg = average_log_probs(logits)
    for n in range(5):
        p = [torch.exp(logits[k, n]) / torch.exp(logits[k, n]).sum() for k in range(4)]
        mean = sum(p) / 4
        torch.testing.assert_close(avg[n].exp(), mean, rtol=1e-12, atol=1e-14)
        h_mean = -float((mean * mean.log()).sum())
        mean_h = sum(-float((q * q.log()).sum()) for q in p) / 4
        jsd = jensen_shannon(torch.softmax(logits, -1))[n]
        torch.testing.assert_close(jsd, torch.tensor(h_mean - mean_h).double())


def test_average_of_identical_members_is_the_member():
    logits = torch.randn(1, 5, 3, dtype=torch.float64).expand(6, 5, 3)
    torch.testing.assert_close(average_log_probs(logits), torch.log_softmax(logits[0], -1))


def test_average_is_stable_for_huge_logits():
    logits = torch.tensor([[[1000.0, -1000.0]], [[-1000.0, 1000.0]]], dtype=torch.float64)
    avg = average_log_probs(logits)
    assert torch.isfinite(avg).all()
    torch.testing.assert_close(avg.exp(), torch.tensor([[0.5, 0.5]], dtype=torch.float64))


def test_bad_input():
    heads = EnsembleHeads(6, 3, num_heads=2)
    with pytest.raises(ValueError, match="embedding"):
        heads(torch.randn(2, 5))
    with pytest.raises(ValueError, match="num_heads"):
        EnsembleHeads(6, 3, num_heads=0)
    with pytest.raises(ValueError, match="logits"):
        average_log_probs(torch.randn(5, 3))


@settings(max_examples=60, deadline=None)
@given(
    k=st.integers(1, 6),
    n=st.integers(1, 4),
    c=st.integers(2, 5),
    scale=st.floats(0.01, 50.0),
    seed=st.integers(0, 2**16),
)
def test_pooled_predictive_properties(k, n, c, scale, seed):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(k, n, c, generator=g, dtype=torch.float64) * scale
    avg = average_log_probs(logits)
    torch.testing.assert_close(avg.exp().sum(-1), torch.ones(n, dtype=torch.float64))
    jsd = jensen_shannon(torch.softmax(logits, -1))
    # 0 <= JSD <= log K (mixture entropy exceeds the mean entropy by at most log K)
    assert bool((jsd >= -1e-12).all()) and bool((jsd <= math.log(k) + 1e-12).all())
    # order of the members does not matter
    torch.testing.assert_close(average_log_probs(logits.flip(0)), avg)
