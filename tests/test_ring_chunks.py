"""``bayesurl.distributed.ring_chunks`` under 3 gloo ranks: every rank sees every
row once, in global order; its own shard arrives whole, the others' in bounded chunks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from bayesurl.distributed import launch_local

SIZES = [7, 0, 12]  # uneven, one empty rank
D = 3


def _whole() -> torch.Tensor:
    return torch.arange(sum(SIZES) * D, dtype=torch.float64).view(-1, D)


def _walk(out: str) -> None:
    from bayesurl.distributed import cleanup, init_from_env, ring_chunks

    info = init_from_env(device="cpu")
    lo, hi = sum(SIZES[: info.rank]), sum(SIZES[: info.rank + 1])
    local = _whole()[lo:hi]
    pieces, rows = [], []
    for off, t in ring_chunks(local, SIZES, chunk_bytes=4 * D * 8):  # 4-row chunks
        pieces.append([off, t.shape[0], t.data_ptr() == local.data_ptr() and t.numel() > 0])
        rows.append(t.clone())
    got = torch.cat(rows) if rows else torch.empty(0, D)
    rec = {"pieces": pieces, "equal": bool(torch.equal(got, _whole())), "range": [lo, hi]}
    Path(out, f"rank{info.rank}.json").write_text(json.dumps(rec))
    cleanup()


@pytest.mark.distributed
def test_ring_chunks_own_shard_whole_others_bounded(tmp_path) -> None:
    launch_local(_walk, 3, (str(tmp_path),), threads=1)
    for r in range(3):
        rec = json.loads((tmp_path / f"rank{r}.json").read_text())
        assert rec["equal"], r  # every row once, in global order
        lo, hi = rec["range"]
        offs = [p[0] for p in rec["pieces"]]
        assert offs == sorted(offs)
        for off, n, is_local in rec["pieces"]:
            if lo <= off < hi:  # this rank's own shard: one piece, the tensor itself
                assert (off, n, is_local) == (lo, hi - lo, True)
            else:
                assert 1 <= n <= 4 and not is_local
        own = sum(1 for p in rec["pieces"] if lo <= p[0] < hi)
        assert own == (1 if hi > lo else 0)
