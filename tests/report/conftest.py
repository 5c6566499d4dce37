"""Result folders shared by the report tests: a smoke sweep (two estimators) and a pretrained
smoke benchmark on frozen features."""

import pytest

from bayesurl.cli import main


@pytest.fixture(scope="session")
def bench_dir(tmp_path_factory):
    """``bayesurl benchmark``'s folder for CE and ELK at a reduced smoke preset."""
    from bayesurl.sweeps import run_sweep

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


@pytest.fixture(scope="session")
def pretrained_dir(tmp_path_factory):
    """``bayesurl benchmark --preset pretrained_smoke`` (frozen features, own cache)."""
    out = tmp_path_factory.mktemp("pretrained")
    code = main(["benchmark", "--methods", "ce", "--preset", "pretrained_smoke", "--device",
                 "cpu", "--out", str(out / "bench"), "--set", f"backbone.cache={out / 'features'}",
                 "--no-progress"])  # fmt: skip
    assert code == 0
    return out / "bench"
