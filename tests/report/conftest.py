"""A small benchmark folder shared by the report tests (one smoke sweep, two estimators)."""

import pytest


@pytest.fixture(scope="session")
def bench_dir(tmp_path_factory):
    """``bayesurl benchmark``'s folder for CE and ELK at a reduced smoke preset."""
    from bayesurl.runs import run_sweep

    out = tmp_path_factory.mktemp("bench")
    run_sweep(
        ["ce", "elk"],
        preset="smoke",
        overrides=["data.max_train=96", "data.max_test=60", "data.max_ood=40"],
        device="cpu",
        out=out,
        progress=False,
        raise_errors=True,
    )
    return out
