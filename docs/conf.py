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
# document "Attributes" sections as fields, not as a second copy of each attribute
napoleon_use_ivar = True
# no intersphinx: the docs build without internet, so references to torch, numpy,
# matplotlib, the standard library and numpydoc type words ("optional", "array-like",
# "callable", {"a", "b"} choices) cannot resolve. Every reference into bayesurl itself is
# still checked (``-n``), except private helpers (``bayesurl.x._y``) shown as base classes.
nitpicky = True
nitpick_ignore_regex = [
    (r"py:.*", r"(?!bayesurl\.).*"),
    (r"py:.*", r"bayesurl\.(.*\.)?_.*"),
]
# re-exported names exist twice (``bayesurl.laplace.Geometry`` and
# ``bayesurl.laplace.curvature.Geometry``); a short reference may match both
suppress_warnings = ["config.cache", "ref.python"]


def _skip_shadowed(app, what, name, obj, skip, options):  # noqa: ANN001, ANN202
    """Skip a package's re-export that has the name of one of its submodules
    (``bayesurl.posthoc.wrap`` the function vs the module): it is documented in the module."""
    mod = getattr(obj, "__module__", None)
    current = app.env.ref_context.get("py:module") or app.env.temp_data.get("autodoc:module")
    if what == "module" and mod and mod.endswith("." + name) and current != mod:
        return True
    return skip


def setup(app):  # noqa: ANN001, ANN201
    app.connect("autodoc-skip-member", _skip_shadowed)


sphinx_gallery_conf = {
    "examples_dirs": ["tutorials_src"],
    "gallery_dirs": ["tutorials"],
    "filename_pattern": r"/plot_",
    "download_all_examples": False,
    "remove_config_comments": True,
    "within_subsection_order": "FileNameSortKey",
    "show_memory": False,
    "plot_gallery": "True",
    # fail the build when a tutorial raises
    "abort_on_example_error": True,
    "only_warn_on_example_error": False,
}

html_theme = "alabaster"
html_static_path: list[str] = []
html_title = "bayesurl"
exclude_patterns = ["_build", "tutorials_src/README.rst"]
templates_path: list[str] = []
