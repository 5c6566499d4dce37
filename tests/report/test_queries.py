"""The per-query record (bayesurl.runs.queries) against brute-force loops."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from bayesurl.runs.predict import score
from bayesurl.runs.queries import (
    QueryRecord,
    query_record,
    read_queries,
    record_from_outputs,
    source_ids,
)
from bayesurl.types import Output


def _brute_nn(x: np.ndarray) -> np.ndarray:
    """Cosine 1-NN of every row among the others, lowest index on ties (plain loops)."""
    n = len(x)
    xn = x / np.linalg.norm(x, axis=1, keepdims=True)
    out = np.empty(n, np.int64)
    for i in range(n):
        best, arg = -np.inf, -1
        for j in range(n):
            if j != i:
                s = float(xn[i] @ xn[j])
                if s > best:
                    best, arg = s, j
        out[i] = arg
    return out


def test_record_matches_brute_force():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(40, 6, generator=g, dtype=torch.float64)
    y = torch.randint(0, 4, (40,), generator=g)
    u = torch.rand(40, generator=g, dtype=torch.float64)
    rec = query_record(x, u, y, ood_u=torch.rand(7, dtype=torch.float64))
    nb = _brute_nn(x.numpy())
    np.testing.assert_array_equal(rec.neighbour, nb)
    labels = y.numpy()
    assert rec.hit.tolist() == [bool(labels[nb[i]] == labels[i]) for i in range(40)]
    np.testing.assert_allclose(rec.u, u.numpy(), rtol=1e-6)
    assert rec.ood_u.shape == (7,) and rec.id_u.shape == (0,) and rec.labelled


def test_record_from_the_evaluators_search_matches_brute_force():
    """The run reuses the evaluator's neighbours (score(return_outputs=True)); the record is
    the one a fresh search gives, with ties to the lowest index (repeated rows)."""
    g = torch.Generator().manual_seed(2)
    x = torch.randn(60, 5, generator=g)
    x[30:40] = x[:10]  # exact ties
    y = torch.randint(0, 4, (60,), generator=g)
    test = torch.utils.data.TensorDataset(x, y)

    def fn(batch, n_samples):
        return Output(embedding=batch, uncertainty=batch.norm(dim=1))

    res = score(fn, SimpleNamespace(test=test, id_test=None, ood=None), None, return_outputs=True)
    nb = res["outputs"]["test_neighbors"]
    assert nb.shape[0] == 60
    rec = record_from_outputs(res["outputs"], {})
    np.testing.assert_array_equal(rec.neighbour, _brute_nn(x.double().numpy()))
    fresh = query_record(x, x.norm(dim=1), y)
    np.testing.assert_array_equal(rec.neighbour, fresh.neighbour)
    with pytest.raises(ValueError, match="`neighbors`"):
        query_record(x, x.norm(dim=1), y, neighbors=nb[:5])


def test_record_without_labels_has_no_hits():
    x = torch.randn(10, 3, dtype=torch.float64)
    rec = query_record(x, torch.rand(10), None)
    assert not rec.labelled and not rec.hit.any() and (rec.label == -1).all()


def test_save_read_round_trip(tmp_path):
    x = torch.randn(12, 4, dtype=torch.float64)
    rec = query_record(x, torch.rand(12), torch.arange(12) % 3, meta={"name": "ce", "seed": 2})
    back = read_queries(rec.save(tmp_path / "q.npz"))
    for key in ("u", "label", "neighbour", "hit", "ood_u", "id_u"):
        np.testing.assert_array_equal(getattr(back, key), getattr(rec, key))
    assert back.meta == {"name": "ce", "seed": 2, "labelled": True}


def test_image_ids_round_trip_and_old_records(tmp_path):
    """Each query's and OOD image's id (first 8 bytes of its SHA-1, big-endian) is kept; a
    record written without them reads back with none."""
    import hashlib

    imgs = torch.randint(0, 256, (6, 1, 5, 5), dtype=torch.uint8)
    digests = [hashlib.sha1(im.numpy().tobytes()).hexdigest() for im in imgs]
    ids = source_ids(digests)
    assert ids.dtype == np.uint64
    assert [int(i) for i in ids] == [int.from_bytes(bytes.fromhex(d)[:8], "big") for d in digests]
    rec = query_record(torch.randn(4, 3), torch.rand(4), torch.arange(4), ood_u=torch.rand(2),
                       source=digests[:4], ood_source=digests[4:])  # fmt: skip
    back = read_queries(rec.save(tmp_path / "q.npz"))
    np.testing.assert_array_equal(back.source, ids[:4])
    np.testing.assert_array_equal(back.ood_source, ids[4:])
    with np.load(tmp_path / "q.npz") as z:
        np.savez_compressed(tmp_path / "old.npz", **{k: z[k] for k in z.files if "source" not in k})
    old = read_queries(tmp_path / "old.npz")
    assert old.source.size == 0 and old.ood_source.size == 0
    with pytest.raises(ValueError, match="`source`"):
        query_record(torch.randn(4, 3), torch.rand(4), None, source=digests[:3])
    with pytest.raises(ValueError, match="`ood_source`"):
        query_record(torch.randn(4, 3), torch.rand(4), None, ood_u=torch.rand(2),
                     ood_source=digests[:1])  # fmt: skip


def test_bad_input_and_corrupt_file(tmp_path):
    with pytest.raises(ValueError, match="`uncertainty`"):
        query_record(torch.randn(5, 2), torch.rand(4), None)
    with pytest.raises(ValueError, match="`labels`"):
        query_record(torch.randn(5, 2), torch.rand(5), torch.zeros(3))
    with pytest.raises(ValueError, match="`embedding`"):
        query_record(torch.randn(1, 2), torch.rand(1), None)
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"not an npz")
    with pytest.raises(ValueError, match="bad.npz"):
        read_queries(bad)
    wrong = QueryRecord(
        np.zeros(3, np.float32), np.zeros(3), np.array([1, 2, 7]), np.zeros(3, bool)
    ).save(tmp_path / "wrong.npz")
    with pytest.raises(ValueError, match="wrong.npz"):
        read_queries(wrong)
    with pytest.raises(FileNotFoundError):
        read_queries(tmp_path / "absent.npz")


def test_sweep_writes_one_record_per_run(bench_dir):
    """The sweep's records agree with its metrics: mean hit = R@1 of the run."""
    from bayesurl.sweeps import read_results

    runs = read_results(bench_dir)["runs"]
    for r in runs:
        rec = read_queries(bench_dir / "queries" / f"{r['estimator']}_s{r['seed']}.npz")
        assert rec.meta["name"] == r["estimator"]
        assert len(rec.u) == r["n_test"] and len(rec.ood_u) == r["n_ood"]
        assert rec.hit.mean() == pytest.approx(r["r@1"], abs=1e-12)
