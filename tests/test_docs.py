"""The Sphinx docs build offline with warnings as errors, and every tutorial renders a figure."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
TUTORIALS = sorted((DOCS / "tutorials_src").glob("plot_*.py"))


@pytest.mark.docs
def test_docs_build_with_warnings_as_errors(tmp_path):
    out = tmp_path / "html"
    env = dict(os.environ, MPLBACKEND="Agg", PYTHONPATH=str(ROOT))
    # sphinx-gallery writes generated tutorials next to the sources: build in a copy
    src = tmp_path / "docs"
    shutil.copytree(DOCS, src, ignore=shutil.ignore_patterns("_build", "tutorials", "generated"))
    (tmp_path / "CHANGELOG.md").write_text((ROOT / "CHANGELOG.md").read_text())
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "sphinx",
            "-b",
            "html",
            "-W",
            "--keep-going",
            "-q",
            str(src),
            str(out),
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-5000:]
    assert (out / "index.html").exists()
    for page in ("getting_started", "concepts/metrics", "concepts/laplace", "api", "recipes"):
        assert (out / f"{page}.html").exists(), page
    assert TUTORIALS, "no tutorials found"
    images = out / "_images"
    for tut in TUTORIALS:
        html = out / "tutorials" / f"{tut.stem}.html"
        assert html.exists(), tut.name
        figs = list(images.glob(f"sphx_glr_{tut.stem}_*.png"))
        assert figs, f"tutorial {tut.name} produced no figure"
        assert all(f.stat().st_size > 2000 for f in figs)
