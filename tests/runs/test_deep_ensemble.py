"""LAM Table 2's "Deep Ensemble" rows as an estimator of the run pipeline (kind
``deep_ensemble`` in ``fashion_mnist_closed.toml``) and the ensemble maths beneath it.

References: scipy's ``orthogonal_procrustes`` (float64) and a rotated copy whose map is known;
numpy from the formulas (normalise, mean, Sra's kappa) on the members' own outputs; plain
``contrastive`` runs at seeds 0, 1, 2 trained on their own (the members must be them bit for
bit); the recorded ``result.json`` and checkpoint of ``bayesurl run``.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import scipy.linalg
import torch

from bayesurl.cli import main
from bayesurl.data import as_tensors
from bayesurl.heads.ensemble import orthogonal_procrustes, pool_embeddings
from bayesurl.runs import build_estimator, load_recipe
from bayesurl.runs.data import build_data
from bayesurl.runs.estimators import DeepEnsembleEstimator
from bayesurl.runs.runner import RunCache, run

DATASET = "fashion_mnist_closed"


@pytest.fixture(autouse=True)
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


# -- orthogonal Procrustes and pooling ---------------------------------------------------------


def test_procrustes_matches_scipy():
    gen = np.random.default_rng(0)
    for n, d in ((40, 3), (200, 16)):
        a, b = gen.standard_normal((n, d)), gen.standard_normal((n, d))
        want, _ = scipy.linalg.orthogonal_procrustes(a, b)
        got = orthogonal_procrustes(torch.from_numpy(a), torch.from_numpy(b))
        assert got.dtype == torch.float64
        np.testing.assert_allclose(got.numpy(), want, atol=1e-12)


@pytest.mark.parametrize("reflect", [False, True])
def test_procrustes_recovers_the_map_of_a_rotated_copy(reflect):
    gen = torch.Generator().manual_seed(1)
    q, _ = torch.linalg.qr(torch.randn(5, 5, generator=gen, dtype=torch.float64))
    if reflect:  # an improper map (det -1) is recovered too: the loss is blind to it as well
        q[:, 0] = -q[:, 0]
    z = torch.randn(100, 5, generator=gen, dtype=torch.float64)
    r = orthogonal_procrustes(z, z @ q)
    np.testing.assert_allclose(r.numpy(), q.numpy(), atol=1e-12)
    np.testing.assert_allclose((r.T @ r).numpy(), np.eye(5), atol=1e-12)


def test_procrustes_and_pooling_reject_bad_input():
    z = torch.randn(10, 3, dtype=torch.float64)
    with pytest.raises(ValueError, match="`source`.*`target`.*same shape"):
        orthogonal_procrustes(z, z[:, :2])
    with pytest.raises(ValueError, match="`target`"):
        orthogonal_procrustes(z, torch.full_like(z, float("nan")))
    with pytest.raises(ValueError, match="`source`"):
        orthogonal_procrustes(z[0], z)
    with pytest.raises(TypeError, match="`source`"):
        orthogonal_procrustes(torch.ones(10, 3, dtype=torch.long), z)
    members = torch.randn(3, 10, 4)
    with pytest.raises(ValueError, match="`rotations`"):
        pool_embeddings(members, torch.eye(4).expand(2, 4, 4))
    with pytest.raises(ValueError, match="`members`"):
        pool_embeddings(members[0])
    with pytest.raises(ValueError, match="`members`"):
        pool_embeddings(members[:0])


# -- the estimator ---------------------------------------------------------------------------


def _numpy_pool(members: np.ndarray, rotations: np.ndarray | None = None):
    """Normalise, rotate, mean, normalise; u = 1 / kappa_hat with Sra's approximation
    ``kappa_hat = R (D - R^2) / (1 - R^2)``, ``R`` the length of the mean of unit vectors."""
    z = members / np.linalg.norm(members, axis=-1, keepdims=True)
    if rotations is not None:
        z = np.stack([z[k] @ rotations[k] for k in range(len(z))])
        z = z / np.linalg.norm(z, axis=-1, keepdims=True)
    mean = z.mean(axis=0)
    r = np.linalg.norm(mean, axis=-1)
    d = z.shape[-1]
    kappa = r * (d - r**2) / (1.0 - r**2)
    return mean / r[:, None], 1.0 / kappa, z


def _images(data, part: str, n: int | None = None) -> torch.Tensor:
    x, _ = as_tensors(getattr(data.sets, part))
    x = x if n is None else x[:n]
    with torch.no_grad():
        return data.transform(x)


def _own_embeddings(members, x: torch.Tensor) -> np.ndarray:
    with torch.no_grad():
        return np.stack([m(x).embedding.double().numpy() for m in members])


@pytest.fixture(scope="module")
def ensembles(tmp_path_factory):
    """Both rows at the smoke preset, seed 0, sharing the deterministic base."""
    torch.set_num_threads(1)
    cache = RunCache(keep={"deterministic"})
    out = {}
    for name in ("deep_ensemble", "deep_ensemble_aligned"):
        cfg = load_recipe(f"{DATASET}/{name}", preset="smoke")
        folder = tmp_path_factory.mktemp(name)
        out[name] = run(cfg, cache=cache, keep_outputs=True, out=folder)
    return out, cache


def test_members_are_plain_contrastive_runs_at_seed_plus_k(ensembles):
    res, _ = ensembles
    est = res["deep_ensemble"].fitted
    assert [e.cfg.seed for e in est.estimators] == [0, 1, 2]
    for k, member in enumerate(est.members):
        # a plain run of the deterministic row, on its own (fresh cache, nothing shared)
        cfg = load_recipe(f"{DATASET}/deterministic", [f"seed={k}"], preset="smoke")
        assert cfg.estimator.method == "contrastive"
        plain = run(cfg, cache=RunCache(), keep_outputs=True).fitted.method.state_dict()
        mine = member.state_dict()
        assert list(mine) == list(plain)
        for key in plain:
            assert torch.equal(mine[key], plain[key]), (k, key)
    # the members differ: independent initialisations
    w = [m.state_dict() for m in est.members]
    key = next(k for k in w[0] if w[0][k].is_floating_point())
    assert not torch.equal(w[0][key], w[1][key])


def test_member_zero_is_the_base_of_this_seed(ensembles):
    res, cache = ensembles
    est = res["deep_ensemble"].fitted
    bases = [e for e, _ in cache.bases.values() if e.cfg.estimator.name == "deterministic"]
    assert len(bases) == 1 and est.members[0] is bases[0].method
    assert res["deep_ensemble"].fit["members"][0] == {"seed": 0, "reused": "base"}


@pytest.mark.parametrize("name", ["deep_ensemble", "deep_ensemble_aligned"])
def test_output_is_the_pooled_member_embeddings(ensembles, name):
    res, _ = ensembles
    est = res[name].fitted
    data = build_data(load_recipe(f"{DATASET}/{name}", preset="smoke"))
    rotations = None
    if est.align:
        # Procrustes of each member onto member 0 on the training images, by scipy
        train = _own_embeddings(est.members, _images(data, "train"))
        train /= np.linalg.norm(train, axis=-1, keepdims=True)
        rotations = np.stack([scipy.linalg.orthogonal_procrustes(z, train[0])[0] for z in train])
        np.testing.assert_allclose(est.rotations.numpy(), rotations, atol=1e-9)
        np.testing.assert_allclose(rotations[0], np.eye(3), atol=1e-9)
    else:
        assert est.rotations is None
    x = _images(data, "test", 64)
    emb, u, samples = _numpy_pool(_own_embeddings(est.members, x), rotations)
    out = est.predict(x, n_samples=4)
    assert out.samples.shape == (3, 64, 3)  # the draws are the K members
    np.testing.assert_allclose(out.embedding.double().numpy(), emb, atol=1e-5)
    np.testing.assert_allclose(out.samples.double().numpy(), samples, atol=1e-5)
    np.testing.assert_allclose(out.uncertainty.double().numpy(), u, rtol=1e-4, atol=1e-6)
    assert est.predict(x, n_samples=0).samples is None


def test_aligned_row_keeps_the_draws_neighbours(ensembles):
    # a rotation of a whole draw keeps its neighbours, so the per-draw ECE is the same; the
    # mean embedding (retrieval) and u differ
    res, _ = ensembles
    plain, aligned = res["deep_ensemble"].metrics, res["deep_ensemble_aligned"].metrics
    assert aligned["ece"] == pytest.approx(plain["ece"], abs=1e-12)
    for m in (plain, aligned):
        for key in ("r@1", "map@1", "map@5", "map@10", "r_auroc", "ausc", "ece", "ood_auroc"):
            assert math.isfinite(m[key]), key


# -- options ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("table", "value", "error", "needle"),
    [
        ("kwargs", {"members": 1}, ValueError, "kwargs.members` must be an integer >= 2"),
        ("kwargs", {"members": 2.5}, ValueError, "kwargs.members` must be an integer >= 2"),
        ("kwargs", {"members": "3"}, TypeError, "kwargs.members` must be an integer"),
        ("kwargs", {"members": True}, TypeError, "kwargs.members` must be an integer"),
        ("kwargs", {"align": "yes"}, ValueError, "kwargs.align` must be true or false"),
        ("kwargs", {"members": 3, "margin": 0.7}, ValueError, "kwargs.margin`; valid: members"),
        ("fit", {"epochs": 1}, ValueError, "fit.epochs`; it takes no options"),
    ],
)
def test_bad_options_name_the_key(table, value, error, needle):
    cfg = load_recipe(f"{DATASET}/deep_ensemble", preset="smoke")
    setattr(cfg.estimator, table, value)
    with pytest.raises(error, match=f"`estimators.deep_ensemble.{needle}"):
        build_estimator(cfg)


def test_a_deep_ensemble_needs_a_base():
    cfg = load_recipe(f"{DATASET}/deep_ensemble", preset="smoke")
    cfg.base = None
    with pytest.raises(ValueError, match="`estimators.deep_ensemble.base`"):
        DeepEnsembleEstimator(cfg)


# -- end to end through the command line -----------------------------------------------------


def test_run_command_end_to_end_and_resume(tmp_path, capsys):
    out = tmp_path / "de"
    args = ["run", f"{DATASET}/deep_ensemble", "--preset", "smoke", "--no-progress"]
    assert main([*args, "--out", str(out)]) == 0
    first = json.loads((out / "result.json").read_text())
    assert first["error"] is None and first["estimator"] == "deep_ensemble"
    assert first["paper"]["map@1"] == 0.69
    m = first["metrics"]
    for key in ("r@1", "map@1", "r_auroc", "ausc", "ece", "ood_auroc"):
        assert 0.0 <= m[key] <= 1.0, key
    assert m["n_samples"] == 3
    state = torch.load(first["checkpoint"], map_location="cpu", weights_only=True)
    assert state["seeds"] == [0, 1, 2] and len(state["members"]) == 3
    assert state["rotations"] is None
    trained = [r for r in first["fit"]["members"] if "resumed" in r]
    assert [r["resumed"] for r in trained] == [False, False]
    # again into the same folder: the finished members are read back, not trained again
    assert main([*args, "--out", str(out)]) == 0
    second = json.loads((out / "result.json").read_text())
    assert [r["resumed"] for r in second["fit"]["members"][1:]] == [True, True]
    again = torch.load(second["checkpoint"], map_location="cpu", weights_only=True)
    for a, b in zip(state["members"], again["members"], strict=True):
        assert all(torch.equal(a[k], b[k]) for k in a)
    for key in ("r@1", "map@1", "r_auroc", "ausc", "ece", "ood_auroc"):
        assert second["metrics"][key] == first["metrics"][key], key
    assert f"{DATASET}/deep_ensemble (seed 0, preset smoke)" in capsys.readouterr().out
