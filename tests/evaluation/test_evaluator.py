"""The evaluate() entry point: keys, agreement with the functional metrics, bad input."""

from __future__ import annotations

import json

import pytest
import torch

from bayesurl.evaluation import REQUIRED_KEYS, evaluate, evaluate_output
from bayesurl.evaluation import functional as Fm
from bayesurl.types import Output


def setup(n: int = 80, d: int = 6, s: int = 10, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 5, (n,), generator=g)
    centers = torch.randn(5, d, generator=g, dtype=torch.float64)
    x = centers[y] + torch.randn(n, d, generator=g, dtype=torch.float64)
    samples = x + 0.3 * torch.randn(s, n, d, generator=g, dtype=torch.float64)
    u = torch.rand(n, generator=g, dtype=torch.float64)
    return x, y, u, samples, torch.rand(20, generator=g, dtype=torch.float64) + 0.5


def test_embeddings_only_gives_none_for_uncertainty_metrics() -> None:
    x, y, *_ = setup()
    res = evaluate(x, y)
    assert set(REQUIRED_KEYS) <= set(res)
    assert res["r@1"] == pytest.approx(float(Fm.r_at_1(x, y)[0]))
    assert res["map@5"] == pytest.approx(float(Fm.map_at_k(x, y, 5)))
    assert res["recall@10"] == pytest.approx(float(Fm.recall_at_k(x, y, 10)))
    for key in ("r_auroc", "ausc", "ause", "ece", "ood_auroc", "ood_auprc"):
        assert res[key] is None
    assert any("ece" in n for n in res["notes"])


def test_all_inputs_match_functional() -> None:
    x, y, u, samples, v = setup()
    res = evaluate(x, y, uncertainties=u, samples=samples, ood_uncertainties=v, return_curves=True)
    _, correct = Fm.r_at_1(x, y)
    assert res["r_auroc"] == pytest.approx(float(Fm.r_auroc(u, correct)))
    assert res["ausc"] == pytest.approx(float(Fm.ausc(u, correct)))
    assert res["ause"] == pytest.approx(float(Fm.ause(u, correct)))
    assert res["ood_auroc"] == pytest.approx(float(Fm.ood_auroc(u, v)))
    assert res["ood_auprc"] == pytest.approx(float(Fm.ood_auprc(u, v)))
    assert res["ece"] == pytest.approx(float(Fm.retrieval_ece(samples, y, mode="exact").ece))
    assert len(res["sparsification"]["r@1"]) == 100
    assert len(res["reliability"]["count"]) == 10
    assert res["uncertainty_source"] == "given"


def test_samples_only_default_u_is_inverse_sra_kappa() -> None:
    _, y, _, samples, _ = setup()
    res = evaluate(None, y, samples=samples)
    mean = Fm.mean_from_samples(samples)
    u = 1.0 / Fm.kappa_from_samples(samples)
    _, correct = Fm.r_at_1(mean, y)
    assert res["r@1"] == pytest.approx(float(correct.double().mean()))
    assert res["r_auroc"] == pytest.approx(float(Fm.r_auroc(u, correct)))
    assert res["ece"] is not None
    assert res["uncertainty_source"].startswith("1/kappa_hat")


def test_single_class_r_auroc_none_with_note() -> None:
    x = torch.randn(10, 3)
    res = evaluate(x, torch.zeros(10, dtype=torch.long), uncertainties=torch.rand(10))
    assert res["r@1"] == 1.0 and res["r_auroc"] is None
    assert any("r_auroc" in n and "correct" in n for n in res["notes"])


def test_tiny_set_recall_at_large_k_is_none() -> None:
    res = evaluate(torch.randn(4, 3), torch.tensor([0, 0, 1, 1]))
    assert res["recall@10"] is None and res["map@5"] is None and res["r@1"] is not None


def test_evaluate_output_draws_vmf_samples_from_kappa(monkeypatch) -> None:
    import numpy as np
    import scipy.special as sp

    import bayesurl.evaluation.evaluator as ev
    from bayesurl.distributions import sample_vmf

    x, y, _, _, v = setup()
    d = x.shape[1]
    kappa = torch.linspace(0.5, 60.0, len(y), dtype=torch.float64)  # A_D from ~0.08 to ~0.96
    u = 1.0 / kappa
    out = Output(embedding=x, uncertainty=u, kappa=kappa)
    ood = Output(embedding=torch.randn(20, d, dtype=torch.float64), uncertainty=v)
    seen = {}
    real = ev.evaluate

    def spy(*args, **kw):
        seen["samples"] = kw["samples"]
        return real(*args, **kw)

    monkeypatch.setattr(ev, "evaluate", spy)
    n = 2000
    evaluate_output(out, y, ood, n_samples=n)
    z = seen["samples"]
    assert z.shape == (n, len(y), d)
    # the draws are vMF(x / ||x||, kappa): mean cosine = A_D(kappa) by scipy's ive (5 SE)
    mu = torch.nn.functional.normalize(x, dim=1)
    w = torch.einsum("snd,nd->sn", z, mu)
    k = kappa.numpy()
    a = torch.from_numpy(sp.ive(d / 2, k) / sp.ive(d / 2 - 1, k))
    var = 1 - (d - 1) * a / kappa - a * a
    dev = (w.mean(0) - a) / (var / n).sqrt()
    assert float(dev.abs().max()) < 5, dev
    assert np.corrcoef(w.mean(0).numpy(), k)[0, 1] > 0.5  # more concentrated with kappa
    # the reported ECE is the exact retrieval ECE of those draws (seed 0 generator)
    r1 = evaluate_output(out, y, ood, n_samples=8, ece_mode="exact")
    r2 = evaluate_output(out, y, ood, n_samples=8, ece_mode="exact")
    assert r1["ece"] == r2["ece"]  # fixed generator
    ref = sample_vmf(mu, kappa, 8, generator=torch.Generator().manual_seed(0))
    assert r1["ece"] == pytest.approx(float(Fm.retrieval_ece(ref, y, mode="exact").ece))
    assert r1["ood_auroc"] == pytest.approx(float(Fm.ood_auroc(u, v)))
    assert evaluate_output(Output(x, u), y)["ece"] is None


NAN = float("nan")


@pytest.mark.parametrize(
    ("args", "kw", "match"),
    [
        ((torch.tensor([[NAN, 1.0], [1.0, 0.0]]), torch.tensor([0, 1])), {}, "embeddings"),
        ((torch.randn(5), torch.arange(5)), {}, "embeddings"),
        ((torch.randn(5, 2), torch.arange(4)), {}, "labels"),
        ((torch.randn(1, 2), torch.arange(1)), {}, "embeddings"),
        ((torch.randn(5, 2), torch.arange(5)), {"uncertainties": torch.rand(4)}, "uncertainties"),
        (
            (torch.randn(5, 2), torch.arange(5)),
            {"uncertainties": torch.tensor([0.1, NAN, 0.2, 0.3, 0.4])},
            "uncertainties",
        ),
        ((torch.randn(5, 2), torch.arange(5)), {"samples": torch.randn(3, 4, 2)}, "samples"),
        ((torch.randn(5, 2), torch.arange(5)), {"samples": torch.randn(3, 5, 3)}, "samples"),
        ((torch.randn(5, 2), torch.arange(5)), {"samples": torch.randn(5, 2)}, "samples"),
        (
            (torch.randn(5, 2), torch.arange(5)),
            {"samples": torch.randn(3, 5, 2).index_put_((torch.tensor([1]),), torch.tensor(NAN))},
            "`samples` contains 10 non-finite values",
        ),
        (
            (None, torch.arange(5)),
            {"samples": torch.randn(3, 5, 2).index_put_((torch.tensor([2]),), torch.tensor(NAN))},
            "`samples` contains 10 non-finite values",
        ),
        (
            (torch.randn(5, 2), torch.arange(5)),
            {"uncertainties": torch.rand(5), "ood_uncertainties": torch.tensor([NAN])},
            "ood_uncertainties",
        ),
        ((torch.randn(5, 2), torch.arange(5)), {"ks": (0,)}, "ks"),
        ((None, torch.arange(5)), {"samples": torch.randn(3, 5, 2), "n_bins": 0}, "n_bins"),
        ((None, torch.arange(5)), {}, "embeddings"),
    ],
)
def test_bad_input(args, kw, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        evaluate(*args, **kw)


def test_evaluate_copy_false_normalises_in_place_same_metrics() -> None:
    """``copy=False`` overwrites the embeddings with their normalised rows and changes no
    metric; ``copy=True`` (default) leaves them untouched; a non-bool is refused."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(80, 7, generator=g) * 3
    y = torch.arange(80) % 6
    u = torch.rand(80, generator=g)
    keep = x.clone()
    want = evaluate(x, y, uncertainties=u)
    assert torch.equal(x, keep)
    got = evaluate(x, y, uncertainties=u, copy=False)
    assert json.dumps(got, sort_keys=True) == json.dumps(want, sort_keys=True)
    eps = torch.finfo(torch.float32).tiny ** 0.5
    assert torch.equal(x, torch.nn.functional.normalize(keep, dim=1, eps=eps))
    with pytest.raises(ValueError, match="`copy`"):
        evaluate(keep, y, uncertainties=u, copy=1)  # type: ignore[arg-type]
