import numpy as np
import scipy.stats
import torch

from bayesurl.uncertainty import jensen_shannon, softmax_entropy


def test_softmax_entropy_matches_scipy():
    logits = torch.randn(7, 5, dtype=torch.float64) * 3
    ref = scipy.stats.entropy(torch.softmax(logits, -1).numpy(), axis=-1)
    np.testing.assert_allclose(softmax_entropy(logits).numpy(), ref, rtol=1e-12)


def test_jensen_shannon_brute_force():
    p = torch.softmax(torch.randn(4, 3, 6, dtype=torch.float64), -1)
    ref = [
        scipy.stats.entropy(p[:, n].mean(0).numpy())
        - np.mean([scipy.stats.entropy(p[s, n].numpy()) for s in range(4)])
        for n in range(3)
    ]
    np.testing.assert_allclose(jensen_shannon(p).numpy(), ref, rtol=1e-10)
    assert torch.all(jensen_shannon(p.mean(0, keepdim=True).expand(4, 3, 6)).abs() < 1e-12)
