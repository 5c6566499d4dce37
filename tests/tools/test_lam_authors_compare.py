"""tools/lam_authors_compare.py: skips with a clear message without the LAM authors' checkout."""

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _tool():
    spec = importlib.util.spec_from_file_location(
        "lam_authors_compare", ROOT / "tools" / "lam_authors_compare.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("given", [False, True])
def test_skips_without_the_authors_checkout(tmp_path, monkeypatch, capsys, given):
    (tmp_path / "src").mkdir()  # their src/ alone is not enough: the StochMan fork is needed
    out = tmp_path / "out.txt"
    argv = ["lam_authors_compare.py", "--out", str(out)] + ([str(tmp_path)] if given else [])
    monkeypatch.setattr(sys, "argv", argv)
    assert _tool().main() == 0
    printed = capsys.readouterr().out
    assert printed.startswith("SKIPPED: ")
    assert (str(tmp_path / "stochman" / "hessian.py") in printed) == given
    assert not out.exists()
