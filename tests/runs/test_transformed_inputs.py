"""``runs.predict.transformed_inputs``: the fixed input batch of the crop test and the probe."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from bayesurl.runs.predict import transformed_inputs


class _Items(torch.utils.data.Dataset):
    """A plain map-style dataset of ``(uint8 image, label)`` items."""

    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randint(0, 256, (n, 1, 4, 4), generator=g, dtype=torch.uint8)

    def __len__(self) -> int:
        return self.x.shape[0]

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return self.x[i], i % 3


class _Scale(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.double() / 255.0 - 0.5


def test_rows_in_the_given_order_through_the_transform():
    ds = _Items(11)
    idx = [7, 0, 10, 3]
    got = transformed_inputs(ds, idx, _Scale())
    # reference: item by item, by hand
    ref = torch.stack([ds[i][0].double() / 255.0 - 0.5 for i in idx])
    torch.testing.assert_close(got, ref, rtol=0, atol=0)
    raw = transformed_inputs(ds, idx, None)
    assert raw.dtype == torch.uint8 and torch.equal(raw, torch.stack([ds[i][0] for i in idx]))


def test_empty_indices_are_refused():
    with pytest.raises(ValueError, match="indices"):
        transformed_inputs(_Items(3), [], None)
