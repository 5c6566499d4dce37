"""Sphinx configuration for bayesurl (builds offline, warnings are errors in CI)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("MPLBACKEND", "Agg")

project = "bayesurl"
author = "the bayesurl developers"
copyright = "2026, the bayesurl developers"
release = "0.1.0"

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
    "sphinx.ext.mathjax",
    "sphinx.ext.viewcode",
    "sphinx_gallery.gen_gallery",
]

autosummary_generate = True
autodoc_default_options = {"members": True, "show-inheritance": True}
autodoc_typehints = "description"
autodoc_mock_imports = ["faiss", "nngeometry"]
napoleon_google_docstring = False
napoleon_numpy_docstring = True
napoleon_use_rtype = False
# no intersphinx: the docs build without internet
nitpicky = False
suppress_warnings = ["config.cache"]

sphinx_gallery_conf = {
    "examples_dirs": ["tutorials_src"],
    "gallery_dirs": ["tutorials"],
    "filename_pattern": r"/plot_",
    "download_all_examples": False,
    "remove_config_comments": True,
    "within_subsection_order": "FileNameSortKey",
    "show_memory": False,
    "plot_gallery": "True",
}

html_theme = "alabaster"
html_static_path: list[str] = []
html_title = "bayesurl"
exclude_patterns = ["_build", "tutorials_src/README.rst"]
templates_path: list[str] = []
