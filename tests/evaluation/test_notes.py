"""The notes a person reads (bayesurl.evaluation.notes): each rule fires on a crafted case and
stays silent on a normal one; the statistics match independent references (scikit-learn's
AUROC, DeLong's variance from its pairwise definition, a brute-force count of same-class
pairs)."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import norm
from sklearn.metrics import roc_auc_score

from bayesurl.evaluation.notes import auroc_note, chance_r1, result_notes, u_digits
from bayesurl.stats.intervals import Interval


def _kinds(notes):
    return [n.kind for n in notes]


def _normal_case(n=600, seed=0):
    """5 balanced classes, R@1 0.8, u higher on the wrong retrievals (R-AUROC about 0.8)."""
    rng = np.random.default_rng(seed)
    labels = np.repeat(np.arange(5), n // 5)
    hit = rng.random(n) < 0.8
    u = rng.normal(1.0, 0.3, n) + 0.5 * (~hit)
    return u, hit, labels


def test_normal_result_has_no_note():
    u, hit, labels = _normal_case()
    ood = np.random.default_rng(1).normal(2.0, 0.3, 200)
    notes = result_notes(
        u, hit=hit, labels=labels, ood_u=ood, final_loss=0.4, untrained_loss=math.log(5)
    )
    assert notes == []


def test_constant_u_note_on_narrow_spread_and_on_ties():
    rng = np.random.default_rng(0)
    # the folder road's Laplace u: 0.013622 to 0.013662 (0.3 % spread)
    u = 0.013622 + 4e-5 * rng.random(500)
    (note,) = result_notes(u)
    assert note.kind == "constant_u" and "0.01362" in note.text
    two = np.where(rng.random(500) < 0.5, 1.0, 2.0)
    assert _kinds(result_notes(two)) == ["constant_u"]
    assert _kinds(result_notes(np.full(50, 3.0))) == ["constant_u"]
    # a 5 % spread is not constant, nor a u centred on 0 (no relative spread to speak of)
    assert result_notes(1.0 + 0.05 * rng.random(500)) == []
    assert result_notes(rng.normal(0.0, 1.0, 500)) == []


def test_inverted_r_auroc_and_ood_auroc():
    u, hit, labels = _normal_case()
    (note,) = result_notes(-u, hit=hit, labels=labels)
    assert note.kind == "inverted_r_auroc" and "R-AUROC" in note.text
    ood = np.random.default_rng(1).normal(0.2, 0.3, 200)  # OOD rated *more* certain
    assert _kinds(result_notes(u, hit=hit, labels=labels, ood_u=ood)) == ["inverted_ood_auroc"]
    # the in-distribution reference is id_u where given
    id_u = np.random.default_rng(2).normal(0.0, 0.3, 300)
    assert result_notes(u, ood_u=ood, id_u=id_u) == []


def test_auroc_below_half_within_noise_is_at_chance_not_inverted():
    rng = np.random.default_rng(3)
    pos, neg = rng.normal(-0.1, 1, 20), rng.normal(0, 1, 20)  # AUROC a bit below 0.5, n = 40
    a = roc_auc_score(np.r_[np.ones(20), np.zeros(20)], np.r_[pos, neg])
    assert a < 0.5
    u = np.r_[pos, neg]
    hit = np.r_[np.zeros(20, bool), np.ones(20, bool)]
    assert _kinds(result_notes(u, hit=hit)) == ["chance_r_auroc"]


def _delong_reference(pos, neg, level=0.95):
    """DeLong et al. (1988) from the pairwise kernel, O(m n), and its logit interval."""
    psi = (pos[:, None] > neg[None, :]) + 0.5 * (pos[:, None] == neg[None, :])
    a = psi.mean()
    v10, v01 = psi.mean(axis=1), psi.mean(axis=0)
    var = v10.var(ddof=1) / pos.size + v01.var(ddof=1) / neg.size
    z = norm.ppf(0.5 + level / 2)
    lg, s = np.log(a / (1 - a)), np.sqrt(var) / (a * (1 - a))
    return a, 1 / (1 + np.exp(-(lg - z * s))), 1 / (1 + np.exp(-(lg + z * s)))


@settings(max_examples=60, deadline=None)
@given(
    n_pos=st.integers(5, 80),
    n_neg=st.integers(5, 80),
    shift=st.floats(-1.5, 1.5),
    ties=st.booleans(),
    seed=st.integers(0, 10_000),
)
def test_at_chance_exactly_where_the_interval_holds_half(n_pos, n_neg, shift, ties, seed):
    """Crafted rows both ways: "at chance" on every row whose DeLong interval (from its
    pairwise definition) holds 0.5, "inverted" on every row whose interval lies below it,
    neither on a row above it."""
    rng = np.random.default_rng(seed)
    pos, neg = rng.normal(shift, 1, n_pos), rng.normal(0, 1, n_neg)
    if ties:
        pos, neg = np.round(pos), np.round(neg)
    a, lo, hi = _delong_reference(pos, neg)
    if not 0 < a < 1:  # perfect separation: no logit interval to compare with
        return
    u = np.r_[pos, neg]
    hit = np.r_[np.zeros(n_pos, bool), np.ones(n_neg, bool)]
    kinds = _kinds(result_notes(u, hit=hit))
    if min(abs(lo - 0.5), abs(hi - 0.5)) < 1e-9:
        return  # on the boundary
    assert ("chance_r_auroc" in kinds) == (lo <= 0.5 <= hi), (a, lo, hi, kinds)
    assert ("inverted_r_auroc" in kinds) == (hi < 0.5), (a, lo, hi, kinds)


def test_auroc_note_reads_the_given_interval():
    at = Interval(0.47, 0.58, 0.95, "delong", 300, "pooled queries")
    note = auroc_note("mixed_r_auroc", 0.52, at)
    assert note is not None and note.kind == "chance_mixed_r_auroc"
    assert "[0.470, 0.580]" in note.text and "300 pooled queries" in note.text
    below = Interval(0.30, 0.45, 0.95, "delong", 300)
    assert auroc_note("ood_auroc", 0.37, below).kind == "inverted_ood_auroc"
    assert auroc_note("r_auroc", 0.6, Interval(0.55, 0.65, 0.95, "delong", 300)) is None
    assert auroc_note("r_auroc", None, at) is None
    # an evaluation's intervals take the place of the record's data (R-AUROC, absent there, is
    # computed from the data: about 0.8, no note); a metric undefined there (None) gets none
    u, hit, labels = _normal_case()
    got = result_notes(
        u, hit=hit, intervals={"mixed_r_auroc": at}, estimates={"mixed_r_auroc": 0.52}
    )
    assert _kinds(got) == ["chance_mixed_r_auroc"]
    assert _kinds(result_notes(-u, hit=hit)) == ["inverted_r_auroc"]
    assert result_notes(-u, hit=hit, estimates={"r_auroc": None}) == []


def test_chance_r1_matches_brute_force_pair_count():
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 4, 57)
    hit = rng.random(57) < 0.5
    r1, p = chance_r1(hit, labels)
    n = labels.size
    same = sum(labels[i] == labels[j] for i in range(n) for j in range(n) if i != j)
    assert p == pytest.approx(same / (n * (n - 1)), abs=1e-15)
    assert r1 == pytest.approx(hit.mean())


def test_chance_r1_note_fires_at_chance_and_not_above():
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(5), 200)
    _, p = chance_r1(np.zeros(1000, bool), labels)
    at_chance = rng.random(1000) < p
    u = rng.normal(1, 0.3, 1000)
    assert "chance_r1" in _kinds(result_notes(u, hit=at_chance, labels=labels))
    above = rng.random(1000) < 0.6
    assert "chance_r1" not in _kinds(result_notes(u, hit=above, labels=labels))


def test_chance_loss_note():
    u = np.random.default_rng(0).normal(1, 0.3, 100)
    notes = result_notes(u, final_loss=1.6236, untrained_loss=math.log(5))
    assert _kinds(notes) == ["chance_loss"] and "1.609" in notes[0].text
    assert result_notes(u, final_loss=0.9, untrained_loss=math.log(5)) == []
    assert result_notes(u, final_loss=1.62, untrained_loss=None) == []


def test_u_digits_tell_two_cards_apart():
    rng = np.random.default_rng(0)
    u = np.r_[0.013622, 0.013662, 0.013622 + 4e-5 * rng.random(300)]
    d = u_digits(u)
    assert f"{0.013622:.3g}" == f"{0.01364:.3g}"  # the old "u 0.0136" on every card
    assert f"{0.013622:.{d}g}" != f"{0.01364:.{d}g}"
    # two cards 1 % of the 5-95 % range apart read differently, for any scale and offset
    for scale, offset in [(1e-5, 0.0), (1.0, 1000.0), (3.0, -7.0)]:
        v = offset + scale * rng.random(1000)
        d = u_digits(v)
        lo, hi = np.quantile(v, [0.05, 0.95])
        a = float(np.median(v))
        b = a + (hi - lo) / 100
        assert f"{a:.{d}g}" != f"{b:.{d}g}", (scale, offset, d)
    assert u_digits(np.full(10, 1.5)) == 3


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="`hit`"):
        result_notes(np.ones(5), hit=np.ones(4))
