"""Suite-wide settings: one intra-op thread per test process.

CI runs the suite with two xdist workers on two cores; letting each worker also spawn intra-op
threads oversubscribes the machine (tiny training steps measured 16x slower).
"""

import pytest
import torch


@pytest.fixture(autouse=True, scope="session")
def _one_thread_per_worker():
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)
