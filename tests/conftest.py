"""Suite-wide settings: one intra-op thread per test process, and no global state leaking from
one test into another.

CI runs the suite with two xdist workers on two cores; letting each worker also spawn intra-op
threads oversubscribes the machine (tiny training steps measured 16x slower).

The suite runs in random order (pytest-randomly, ``make test`` prints the seed; rerun one order
with ``-p randomly --randomly-seed=N``). pytest-randomly reseeds ``random`` and NumPy before
each test; :func:`_isolated_global_state` does the same for torch and restores what a test may
change globally (torch RNG, default dtype, thread count, mpmath precision), so a test passes
alone, in any order and on any xdist shard.

Triton, where installed, runs its kernels in its CPU interpreter (``TRITON_INTERPRET=1``).
"""

import os

# Triton kernels (bayesurl.search.fused) run in Triton's CPU interpreter in the tests: the
# variable is read when Triton is first imported, so it is set before anything imports it
# (TRITON_INTERPRET=0 in the environment tests the compiled kernel on a GPU instead)
os.environ.setdefault("TRITON_INTERPRET", "1")

import mpmath  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

#: the throwaway PostgreSQL server of the storage tests (fixture ``postgres``)
pytest_plugins = ("postgres_server",)


@pytest.fixture(autouse=True, scope="session")
def _one_thread_per_worker():
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


@pytest.fixture(autouse=True)
def _isolated_global_state():
    rng = torch.get_rng_state()
    dtype = torch.get_default_dtype()
    threads = torch.get_num_threads()
    dps = mpmath.mp.dps
    grad = torch.is_grad_enabled()
    torch.manual_seed(0)  # the same torch RNG state at the start of every test, whatever ran before
    yield
    torch.set_rng_state(rng)
    torch.set_default_dtype(dtype)
    torch.set_num_threads(threads)
    torch.set_grad_enabled(grad)
    mpmath.mp.dps = dps


@pytest.fixture
def refuse_network(monkeypatch):
    """Every outgoing connection (``connect``, ``connect_ex``, ``create_connection``) fails the
    test: what runs under it must work offline."""
    import socket

    def refuse(*args, **kwargs):
        raise AssertionError("network access attempted")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
