"""ggn_diagonal against brute-force J^T H J built with torch.func (float64)."""

from __future__ import annotations

import itertools

import pytest
import torch
from pytorch_metric_learning.miners import BatchEasyHardMiner, PairMarginMiner
from torch import nn
from torch.func import functional_call, hessian, jacrev

from bayesurl.laplace import clamped_fraction, ggn_diagonal, split_pairs

COMBOS = list(itertools.product(["fixed", "positive", "full"], ["euclidean", "arccos"]))


def _layer(f: int, d: int, seed: int, bias: bool = True) -> nn.Linear:
    torch.manual_seed(seed)
    return nn.Linear(f, d, bias=bias).double()


def _one_minus_cos(zz: torch.Tensor, d: int) -> torch.Tensor:
    z1, z2 = zz[:d], zz[d:]
    return 1 - (z1 @ z2) / (z1.norm() * z2.norm())


def _reference(layer, phi, tup, approximation, geometry, margin):
    """Brute force: full Jacobian by jacrev, explicit 2D x 2D output Hessian, diagonal."""
    names = [n for n, _ in layer.named_parameters()]
    shapes = [p.shape for _, p in layer.named_parameters()]
    theta = torch.nn.utils.parameters_to_vector(layer.parameters()).detach()
    d = layer.out_features

    def unflat(t):
        out, i = {}, 0
        for n, s in zip(names, shapes):
            k = s.numel()
            out[n] = t[i : i + k].reshape(s)
            i += k
        return out

    a1, p, a2, n = split_pairs(tup, phi.shape[0])
    total = torch.zeros_like(theta)
    with torch.no_grad():
        u = nn.functional.normalize(layer(phi), dim=1)
    pairs = [(int(i), int(j), 1.0) for i, j in zip(a1, p)]
    if approximation != "positive":
        for i, j in zip(a2, n):
            if float((u[i] - u[j]).norm()) < margin:
                pairs.append((int(i), int(j), -1.0))
    for i, j, sign in pairs:
        x = phi[[i, j]]
        if geometry == "euclidean":

            def f(t, x=x):
                out = functional_call(layer, unflat(t), (x,))
                return nn.functional.normalize(out, dim=1).reshape(-1)

            eye = torch.eye(d, dtype=phi.dtype)
            h = torch.cat([torch.cat([eye, -eye], 1), torch.cat([-eye, eye], 1)], 0)
        else:

            def f(t, x=x):
                return functional_call(layer, unflat(t), (x,)).reshape(-1)

            zz = f(theta).detach()
            h = hessian(_one_minus_cos)(zz, d)
        if approximation == "fixed":
            h = h.clone()
            h[:d, d:] = 0
            h[d:, :d] = 0
        jac = jacrev(f)(theta)  # [2D, P]
        total += sign * torch.diagonal(jac.T @ h @ jac)
    return total


def _hand_pairs():
    return (
        torch.tensor([0, 1, 2, 5]),
        torch.tensor([3, 4, 6, 7]),
        torch.tensor([0, 0, 1, 2, 3, 6]),
        torch.tensor([1, 2, 5, 7, 6, 4]),
    )


@pytest.mark.parametrize("approximation,geometry", COMBOS)
@pytest.mark.parametrize("bias", [True, False])
def test_matches_bruteforce_hand_pairs(approximation, geometry, bias):
    layer = _layer(5, 4, 0, bias)
    torch.manual_seed(1)
    phi = torch.randn(8, 5, dtype=torch.float64)
    tup = _hand_pairs()
    margin = 1.5  # some negatives inside, some outside
    got = ggn_diagonal(
        layer,
        phi,
        tup,
        approximation=approximation,
        geometry=geometry,
        margin=margin,
        clamp=False,
    )
    ref = _reference(layer, phi, tup, approximation, geometry, margin)
    assert got.shape == ref.shape
    torch.testing.assert_close(got, ref, rtol=1e-10, atol=1e-10)
    # the clamped version is the raw one with negatives zeroed, never negative
    clamped = ggn_diagonal(
        layer, phi, tup, approximation=approximation, geometry=geometry, margin=margin
    )
    assert bool((clamped >= 0).all())
    torch.testing.assert_close(clamped, ref.clamp_min(0))


@pytest.mark.parametrize("approximation,geometry", COMBOS)
def test_matches_bruteforce_mined_pairs(approximation, geometry):
    layer = _layer(6, 3, 2)
    torch.manual_seed(3)
    phi = torch.randn(10, 6, dtype=torch.float64)
    labels = torch.arange(10) % 3
    margin = 1.0
    emb = nn.functional.normalize(layer(phi).detach(), dim=1)
    # the default Hessian miner of MetricLaplace (one hard positive + one hard negative)
    tup = BatchEasyHardMiner(pos_strategy="hard", neg_strategy="hard")(emb, labels)
    assert len(tup[0]) > 0 and len(tup[2]) > 0
    got = ggn_diagonal(
        layer, phi, tup, approximation=approximation, geometry=geometry, margin=margin, clamp=False
    )
    ref = _reference(layer, phi, tup, approximation, geometry, margin)
    torch.testing.assert_close(got, ref, rtol=1e-10, atol=1e-10)


def test_matches_bruteforce_pair_margin_miner():
    layer = _layer(4, 3, 11)
    torch.manual_seed(12)
    phi = torch.randn(6, 4, dtype=torch.float64)
    labels = torch.tensor([0, 0, 1, 1, 2, 2])
    emb = nn.functional.normalize(layer(phi).detach(), dim=1)
    tup = PairMarginMiner(pos_margin=0.0, neg_margin=1.2)(emb, labels)
    kw = dict(approximation="full", geometry="arccos", margin=1.2)
    got = ggn_diagonal(layer, phi, tup, clamp=False, **kw)
    torch.testing.assert_close(got, _reference(layer, phi, tup, **kw), rtol=1e-10, atol=1e-10)


def test_arccos_blocks_equal_autograd_hessian_of_one_minus_cos():
    from bayesurl.laplace import output_hessian_diagonals

    torch.manual_seed(4)
    d = 5
    z1, z2 = torch.randn(2, d, dtype=torch.float64)
    h = hessian(_one_minus_cos)(torch.cat([z1, z2]), d)
    a, b, c = output_hessian_diagonals(z1[None], z2[None], "arccos")
    torch.testing.assert_close(a[0], torch.diagonal(h[:d, :d]))
    torch.testing.assert_close(b[0], torch.diagonal(h[:d, d:]))
    torch.testing.assert_close(c[0], torch.diagonal(h[d:, d:]))
    # The reference code's "m11 - 2 m12 + m22" would negate the cross term: not the GGN.
    assert not torch.allclose(a[0] - 2 * b[0] + c[0], a[0] + 2 * b[0] + c[0])


def test_euclidean_blocks_equal_projected_identity():
    from bayesurl.laplace import output_hessian_diagonals

    torch.manual_seed(5)
    d = 4
    z1, z2 = torch.randn(2, d, dtype=torch.float64)
    jn = jacrev(lambda z: nn.functional.normalize(z, dim=0))
    p1, p2 = jn(z1), jn(z2)
    a, b, c = output_hessian_diagonals(z1[None], z2[None], "euclidean")
    torch.testing.assert_close(a[0], torch.diagonal(p1.T @ p1))
    torch.testing.assert_close(b[0], -torch.diagonal(p1.T @ p2))
    torch.testing.assert_close(c[0], torch.diagonal(p2.T @ p2))


def test_triplet_form_equals_pair_form():
    layer = _layer(4, 3, 6)
    phi = torch.randn(6, 4, dtype=torch.float64)
    a, p, n = torch.tensor([0, 1]), torch.tensor([2, 3]), torch.tensor([4, 5])
    kw = dict(approximation="full", geometry="arccos", margin=2.1, clamp=False)
    torch.testing.assert_close(
        ggn_diagonal(layer, phi, (a, p, n), **kw), ggn_diagonal(layer, phi, (a, p, a, n), **kw)
    )


def test_negatives_outside_margin_contribute_nothing():
    layer = _layer(4, 3, 7)
    phi = torch.randn(6, 4, dtype=torch.float64)
    pos = (torch.tensor([0]), torch.tensor([1]))
    empty = torch.tensor([], dtype=torch.long)
    neg = (torch.tensor([2, 3]), torch.tensor([4, 5]))
    kw = dict(approximation="full", geometry="euclidean", clamp=False)
    only_pos = ggn_diagonal(layer, phi, (*pos, empty, empty), margin=1e-9, **kw)
    tiny_margin = ggn_diagonal(layer, phi, (*pos, *neg), margin=1e-9, **kw)
    big_margin = ggn_diagonal(layer, phi, (*pos, *neg), margin=2.5, **kw)
    torch.testing.assert_close(only_pos, tiny_margin)
    assert not torch.allclose(only_pos, big_margin)


def test_clamped_fraction():
    assert clamped_fraction(torch.tensor([-1.0, 0.0, 2.0, -3.0])) == 0.5


def test_float32_follows_input_dtype():
    layer = nn.Linear(4, 3)
    out = ggn_diagonal(layer, torch.randn(8, 4), _hand_pairs())
    assert out.dtype == torch.float32 and out.shape == (15,)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(approximation="nope"), "approximation"),
        (dict(geometry="cosine"), "geometry"),
        (dict(margin=0.0), "margin"),
    ],
)
def test_bad_options(kwargs, match):
    layer = _layer(4, 3, 8)
    phi = torch.randn(8, 4, dtype=torch.float64)
    with pytest.raises(ValueError, match=match):
        ggn_diagonal(layer, phi, _hand_pairs(), **kwargs)


def test_bad_inputs():
    layer = _layer(5, 3, 9)
    phi = torch.randn(8, 5, dtype=torch.float64)
    with pytest.raises(ValueError, match="layer"):
        ggn_diagonal(nn.Conv1d(1, 1, 1), phi, _hand_pairs())
    bad = phi.clone()
    bad[0, 0] = float("nan")
    with pytest.raises(ValueError, match="features"):
        ggn_diagonal(layer, bad, _hand_pairs())
    with pytest.raises(ValueError, match="features"):
        ggn_diagonal(layer, phi[:, :4], _hand_pairs())
    with pytest.raises(ValueError, match="indices_tuple"):
        ggn_diagonal(layer, phi, (torch.tensor([0]), torch.tensor([1, 2])) * 2)
    with pytest.raises(ValueError, match="indices_tuple"):
        ggn_diagonal(layer, phi, (torch.tensor([0]), torch.tensor([9])) * 2)
    with pytest.raises(ValueError, match="indices_tuple"):
        ggn_diagonal(layer, phi, (torch.tensor([0]),))


def test_arccos_blocks_are_hessian_of_the_training_loss_for_a_positive_pair():
    """The arccos output Hessian is the Hessian of the contrastive loss actually trained."""
    from pytorch_metric_learning.reducers import SumReducer

    from bayesurl.laplace import output_hessian_diagonals
    from bayesurl.losses.contrastive import ContrastiveLoss

    torch.manual_seed(10)
    d = 4
    z = torch.randn(4, d, dtype=torch.float64)
    loss = ContrastiveLoss(margin=0.5, reducer=SumReducer())
    empty = torch.tensor([], dtype=torch.long)
    # two positive pairs (PML returns zero for a single pair), (0, 1) and (2, 3)
    tup = (torch.tensor([0, 2]), torch.tensor([1, 3]), empty, empty)
    labels = torch.tensor([0, 0, 1, 1])
    h = torch.autograd.functional.hessian(
        lambda zz: loss(zz.reshape(4, d), labels, tup), z.reshape(-1)
    )
    assert float(h.abs().max()) > 0
    a, b, c = output_hessian_diagonals(z[:1], z[1:2], "arccos")
    torch.testing.assert_close(torch.diagonal(h[:d, :d]), a[0])
    torch.testing.assert_close(torch.diagonal(h[:d, d : 2 * d]), b[0])
    torch.testing.assert_close(torch.diagonal(h[d : 2 * d, d : 2 * d]), c[0])
