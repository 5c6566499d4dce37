"""CPU-side tests of what the GPU roads need: code that meets a CUDA tensor or a CUDA machine,
checked here with stand-ins (a tensor that refuses numpy as a CUDA tensor does, a machine
whose CUDA answers are patched)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch import nn

from bayesurl import distributed as D
from bayesurl.evaluation.notes import chance_r1, result_notes
from bayesurl.posthoc import EmbeddingCache


class CudaLike(torch.Tensor):
    """A CPU tensor that, like a CUDA tensor, cannot become a numpy array until ``.cpu()``."""

    def __array__(self, *args: object, **kwargs: object) -> np.ndarray:
        raise TypeError("can't convert cuda:0 device type tensor to numpy. Use Tensor.cpu()")

    def numpy(self, *args: object, **kwargs: object) -> np.ndarray:
        raise TypeError("can't convert cuda:0 device type tensor to numpy. Use Tensor.cpu()")

    def cpu(self, *args: object, **kwargs: object) -> torch.Tensor:
        return torch.Tensor.cpu(self.as_subclass(torch.Tensor))


def cuda_like(t: torch.Tensor) -> torch.Tensor:
    return t.as_subclass(CudaLike)


def test_stand_in_refuses_numpy() -> None:
    t = cuda_like(torch.arange(3))
    with pytest.raises(TypeError, match="cuda"):
        np.asarray(t)
    assert np.asarray(t.detach().cpu()).tolist() == [0, 1, 2]


def test_notes_take_labels_on_any_device() -> None:
    g = torch.Generator().manual_seed(0)
    hit = torch.rand(200, generator=g) < 0.05  # below chance (0.1): the chance note
    labels = torch.randint(0, 10, (200,), generator=g)
    assert chance_r1(cuda_like(hit), cuda_like(labels)) == chance_r1(hit, labels)
    u = torch.rand(200, generator=g)
    got = result_notes(cuda_like(u), hit=cuda_like(hit), labels=cuda_like(labels))
    ref = result_notes(u, hit=hit, labels=labels)
    assert [n.text for n in got] == [n.text for n in ref]
    assert any(n.kind == "chance_r1" for n in ref)  # the labels' note is among them


def test_embedding_cache_rows_take_an_index_on_any_device(tmp_path) -> None:
    enc = nn.Linear(3, 2)
    x, y = torch.randn(6, 3), torch.arange(6)
    EmbeddingCache.build(enc, [(x, y)], tmp_path, progress=False)
    cache = EmbeddingCache(tmp_path)
    idx = torch.tensor([4, 1])
    e_ref, y_ref = cache.rows(idx)
    e, yy = cache.rows(cuda_like(idx))
    assert torch.equal(e, e_ref) and torch.equal(yy, y_ref)
    assert yy.tolist() == [4, 1]


@pytest.mark.parametrize(
    ("gpus", "local_world", "device", "backend"),
    [
        (1, 2, "cuda:0", "gloo"),  # two ranks share one GPU: NCCL refuses, gloo
        (2, 2, "cuda:1", "nccl"),  # one GPU per rank
        (4, 2, "cuda:1", "nccl"),
    ],
)
def test_init_from_env_ranks_sharing_a_gpu(
    monkeypatch: pytest.MonkeyPatch, gpus: int, local_world: int, device: str, backend: str
) -> None:
    calls: dict[str, object] = {}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: calls.setdefault("set_device", d))
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(
        dist, "init_process_group", lambda **kw: calls.setdefault("backend", kw["backend"])
    )
    for key, value in {
        "WORLD_SIZE": "2",
        "RANK": "1",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": str(local_world),
    }.items():
        monkeypatch.setenv(key, value)
    info = D.init_from_env()
    assert str(info.device) == device
    assert info.backend == backend == calls["backend"]
    assert str(calls["set_device"]) == device


def test_init_from_env_cpu_untouched(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    info = D.init_from_env(device="cpu")
    assert info.device == torch.device("cpu") and info.backend == "gloo"
