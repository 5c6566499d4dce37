"""The Evaluator object: settings checked once at construction, a call per input set, and
evaluate() as its front (the same result bit for bit)."""

from __future__ import annotations

import dataclasses
import inspect
import json

import pytest
import torch

from bayesurl.evaluation import Evaluator, evaluate


def _inputs(seed: int, n: int = 60, d: int = 5, s: int = 6) -> dict:
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 4, (n,), generator=g)
    x = torch.randn(4, d, generator=g, dtype=torch.float64)[y]
    x = x + torch.randn(n, d, generator=g, dtype=torch.float64)
    return {
        "embeddings": x,
        "labels": y,
        "uncertainties": torch.rand(n, generator=g, dtype=torch.float64),
        "samples": x + 0.4 * torch.randn(s, n, d, generator=g, dtype=torch.float64),
        "ood_uncertainties": torch.rand(15, generator=g, dtype=torch.float64) + 0.5,
    }


def _dump(res: dict) -> str:
    return json.dumps({k: v for k, v in res.items() if k != "neighbors"}, sort_keys=True)


def test_one_evaluator_on_several_inputs_equals_evaluate_on_each() -> None:
    """Reusing one Evaluator leaks nothing from one call into the next (the per-call options
    are copies): each result equals a fresh evaluate() of the same input, bit for bit."""
    options = {"ks": (1, 3), "n_bins": 7, "return_curves": True, "reference": "lam"}
    evaluator = Evaluator(**options, return_neighbors=True)
    first = _inputs(0)
    for inputs in (first, _inputs(1), {**first, "embeddings": None}, first):
        got = evaluator(**inputs)
        want = evaluate(**inputs, **options, return_neighbors=True)
        assert _dump(got) == _dump(want)
        assert torch.equal(got["neighbors"], want["neighbors"])
    assert "x_is_mean" not in evaluator.options  # a call's own settings stay in the call


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"ks": (0,)}, "ks"),
        ({"map_ks": (2.5,)}, "map_ks"),
        ({"n_bins": 0}, "n_bins"),
        ({"ece_mode": "fast"}, "ece_mode"),
        ({"shortlist": 0}, "shortlist"),
        ({"tolerance": -0.1}, "tolerance"),
        ({"memory_budget": 0}, "memory_budget"),
        ({"backend": "annoy"}, "backend"),
        ({"return_curves": "yes"}, "return_curves"),
        ({"progress": 1}, "progress"),
        ({"return_neighbors": None}, "return_neighbors"),
        ({"copy": 0}, "copy"),
        ({"reference": "url"}, "reference"),
        ({"include": ["r@2"]}, "include"),
        ({"exclude": "ece"}, "exclude"),
        ({"group": object()}, "group"),
    ],
)
def test_bad_settings_refused_at_construction(options: dict, match: str) -> None:
    """Every setting is checked before any input is seen, the error naming it."""
    with pytest.raises((ValueError, TypeError), match=match):
        Evaluator(**options)


def test_evaluate_is_a_front_over_the_evaluator() -> None:
    """evaluate's parameters are exactly the Evaluator's settings plus its call's inputs, with
    the same defaults, so the two cannot drift apart."""
    front = inspect.signature(evaluate).parameters
    settings = {f.name: f.default for f in dataclasses.fields(Evaluator) if f.init}
    call = dict(list(inspect.signature(Evaluator.__call__).parameters.items())[1:])
    assert set(front) == set(settings) | set(call)
    assert not set(settings) & set(call)
    for name, p in front.items():
        want = settings[name] if name in settings else call[name].default
        assert p.default == want, name


def test_evaluator_is_frozen() -> None:
    evaluator = Evaluator()
    with pytest.raises(dataclasses.FrozenInstanceError):
        evaluator.ks = (1,)  # type: ignore[misc]


def test_evaluate_passes_its_settings_to_the_evaluator() -> None:
    """evaluate declares the inputs only: a setting reaches the Evaluator as typed (checked
    there, the error naming it) and an unknown keyword is refused, naming it."""
    x, y = torch.randn(30, 4, dtype=torch.float64), torch.arange(30) % 3
    res = evaluate(x, y, include=["r@1", "recall@k"], ks=(1, 2), intervals=False)
    want = Evaluator(include=["r@1", "recall@k"], ks=(1, 2), intervals=False)(x, y)
    assert res["recall@2"] == want["recall@2"] and res["r@1"] == want["r@1"]
    with pytest.raises(ValueError, match="tolerance"):
        evaluate(x, y, tolerance=-0.1)
    with pytest.raises(TypeError, match="unknown keyword `kz`.*ks"):
        evaluate(x, y, kz=(1,))
