import pytest
import torch


@pytest.fixture(autouse=True)
def _float64_default():
    """The loss references are float64; restore the global default afterwards so other test
    files (which check that float32 inputs stay float32) are not affected."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(old)
