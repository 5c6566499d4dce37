"""``Evaluator(search=...)``: any object with pytorch-metric-learning's knn_func contract; the
names keep working; a bad object or a bad answer raises naming ``search``."""

from __future__ import annotations

import pytest
import torch
from pytorch_metric_learning.distances import CosineSimilarity
from pytorch_metric_learning.utils.inference import CustomKNN

from bayesurl.evaluation import Evaluator, ExactSearch, FaissSearch, evaluate
from bayesurl.search.backends import KnnFunc, resolve_search


class BruteForce:
    """Every cosine in float64, one stable sort per query: (similarity desc, index asc)."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, query, k, reference, ref_includes_query=False):
        self.calls += 1
        q = torch.nn.functional.normalize(query.double(), dim=1)
        r = torch.nn.functional.normalize(reference.double(), dim=1)
        sims = q @ r.T
        if ref_includes_query:
            sims.fill_diagonal_(-torch.inf)
        order = torch.argsort(-sims, dim=1, stable=True)[:, :k]
        return sims.gather(1, order), order


def data(n: int = 240, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 6, (n,), generator=g)
    x = torch.randn(6, 10, generator=g)[y] + 1.3 * torch.randn(n, 10, generator=g)
    return x, y, torch.rand(n, generator=g), 2 + torch.rand(50, generator=g)


def scalars(res) -> dict:
    return {k: v for k, v in res.items() if isinstance(v, float | int) or v is None}


def test_brute_force_object_gives_identical_metrics() -> None:
    x, y, u, v = data()
    include = ["r@1", "recall@k", "r_auroc", "ausc", "aurc", "ood_auroc", "map@k", "map@r"]
    default = evaluate(x, y, uncertainties=u, ood_uncertainties=v, include=include)
    brute = BruteForce()
    plugged = evaluate(x, y, uncertainties=u, ood_uncertainties=v, include=include, search=brute)
    assert brute.calls == 1  # the one search
    assert scalars(plugged) == scalars(default)
    assert plugged["intervals"] == default["intervals"]
    assert default["r@1"] is not None and default["map@10"] is not None


@pytest.mark.parametrize("name, cls", [("torch", ExactSearch), ("faiss", FaissSearch)])
def test_names_resolve_to_objects(name: str, cls: type) -> None:
    if name == "faiss":
        pytest.importorskip("faiss")
    x, y, u, _ = data(seed=1)
    assert type(resolve_search(name)) is cls
    assert isinstance(cls(), KnnFunc)
    by_name = evaluate(x, y, uncertainties=u, search=name)
    by_object = evaluate(x, y, uncertainties=u, search=cls())
    assert scalars(by_name) == scalars(by_object)
    if name == "torch":  # backend= is the same search by its old name
        assert scalars(evaluate(x, y, uncertainties=u, backend="torch")) == scalars(by_name)


def test_objects_follow_the_pml_contract() -> None:
    x, *_ = data(60, seed=2)
    sims, ids = ExactSearch()(x, 4, x, True)
    ref_sims, ref_ids = BruteForce()(x, 4, x, True)
    assert torch.equal(ids, ref_ids)
    assert torch.allclose(sims.double(), ref_sims, atol=1e-6)
    q = x[:7] + 0.1
    assert torch.equal(ExactSearch()(q, 3, x, False)[1], BruteForce()(q, 3, x, False)[1])


def test_pml_custom_knn_plugs_in() -> None:
    x, y, u, _ = data(seed=3)
    x = x.double()
    pml = evaluate(x, y, uncertainties=u, search=CustomKNN(CosineSimilarity()))
    assert scalars(pml) == scalars(evaluate(x, y, uncertainties=u))


def wrong_shape(query, k, reference, ref_includes_query=False):
    return None, torch.zeros(query.shape[0], k + 1, dtype=torch.long)


def lists_self(query, k, reference, ref_includes_query=False):
    ids = torch.arange(query.shape[0])[:, None].repeat(1, k)
    return None, ids


def out_of_range(query, k, reference, ref_includes_query=False):
    return None, torch.full((query.shape[0], k), query.shape[0])


@pytest.mark.parametrize(
    "bad, match",
    [
        (3, "`search` must be a name"),
        ("annoy", "`search` must be one of"),
        (lambda q, k: None, "`search` must be callable as search"),
        (lambda q, k, r, i: torch.zeros(3), "`search` must return"),
        (
            lambda q, k, r, i: (None, torch.zeros(q.shape[0], k)),
            "`search` returned indices of dtype",
        ),
        (wrong_shape, "`search` returned indices of shape"),
        (lists_self, "`search` listed a query as its own neighbour"),
        (out_of_range, "`search` returned ids outside"),
    ],
)
def test_bad_objects_raise_naming_search(bad, match: str) -> None:
    x, y, *_ = data(40, seed=4)
    with pytest.raises(ValueError, match=match):
        Evaluator(search=bad)(x, y)


def test_search_and_backend_together_raise() -> None:
    with pytest.raises(ValueError, match="not both"):
        Evaluator(search="torch", backend="faiss")
    with pytest.raises(ValueError, match="`backend` must be one of"):
        Evaluator(backend="annoy")
