"""Sphinx configuration for bayesurl (builds offline, warnings are errors in CI)."""

from __future__ import annotations

import os
import sys
import types
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
# module pages: automodule documents each module's __all__; the template (_templates/)
# lists only the submodules, so summary tables never point at undocumented helpers
autosummary_ignore_module_all = True
# ``python -m bayesurl`` runs the CLI on import: give autosummary an empty stand-in
sys.modules.setdefault("bayesurl.__main__", types.ModuleType("bayesurl.__main__"))
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


def _shadowed_modules() -> list[str]:
    """Submodules that their package shadows with a re-export of the same name
    (``bayesurl.posthoc.wrap`` is the function ``wrap``): autodoc would import the attribute,
    so these get no page of their own; their public names are documented on the package."""
    import importlib
    import pkgutil

    import bayesurl

    out = []
    for info in pkgutil.walk_packages(bayesurl.__path__, "bayesurl."):
        if info.name.endswith("__main__"):
            continue
        importlib.import_module(info.name)
        parent, _, short = info.name.rpartition(".")
        attr = vars(sys.modules[parent]).get(short)
        if attr is not None and not isinstance(attr, types.ModuleType):
            out.append(info.name)
    return out


autosummary_context = {"shadowed": _shadowed_modules()}


def _write_recipe_page() -> None:
    """docs/recipe_configs.rst: every dataset x estimator config, generated from the TOML
    recipe files (bayesurl.runs.config.describe_recipes), so the page cannot drift."""
    from bayesurl.runs.config import describe_recipes

    page = Path(__file__).resolve().parent / "recipe_configs.rst"
    text = describe_recipes()
    if not page.is_file() or page.read_text() != text:
        page.write_text(text)


_write_recipe_page()


# names that ``bayesurl/__init__.py`` exposes lazily, documented where they are defined
_ALIASES = {
    "bayesurl.evaluate": "bayesurl.evaluation.evaluate",
    "bayesurl.MetricLaplace": "bayesurl.laplace.MetricLaplace",
    "bayesurl.wrap": "bayesurl.posthoc.wrap",
}


def _resolve_alias(app, env, node, contnode):  # noqa: ANN001, ANN202
    target = _ALIASES.get(node.get("reftarget", ""))
    if target is None or node.get("refdomain") != "py":
        return None
    domain = env.get_domain("py")
    reftype = "obj" if node["reftype"] == "class" else node["reftype"]
    return domain.resolve_xref(env, node["refdoc"], app.builder, reftype, target, node, contnode)


# ---- MathJax, offline -----------------------------------------------------------------------
# The formulas must render without internet: MathJax 2 from Debian's libjs-mathjax
# (``apt-get install libjs-mathjax``; or set BAYESURL_MATHJAX to a MathJax 2 folder) is copied
# into ``_static/mathjax`` of the built site -- only the SVG output with the TeX fonts (~2.5 MB,
# no web fonts, so it also renders from ``file://``). Nothing is committed to the repository.
_MATHJAX_CANDIDATES = [
    os.environ.get("BAYESURL_MATHJAX", ""),
    "/usr/share/javascript/mathjax",
    "/usr/share/mathjax",
]
_MATHJAX_PARTS = [
    "MathJax.js",
    "config/TeX-AMS_SVG-full.js",
    "extensions",
    "jax/input/TeX",
    "jax/element",
    "jax/output/SVG/jax.js",
    "jax/output/SVG/config.js",
    "jax/output/SVG/autoload",
    "jax/output/SVG/fonts/TeX",
    "localization/en",
]


def _mathjax_source() -> Path | None:
    for cand in _MATHJAX_CANDIDATES:
        if cand and (Path(cand) / "MathJax.js").is_file():
            return Path(cand)
    return None


_MATHJAX = _mathjax_source()
if _MATHJAX is not None:
    mathjax_path = "mathjax/MathJax.js?config=TeX-AMS_SVG-full"
    mathjax2_config = {"SVG": {"font": "TeX"}, "showMathMenu": False, "messageStyle": "none"}


def _copy_mathjax(app, exc):  # noqa: ANN001, ANN202
    """After an html build: the MathJax subset into ``_static/mathjax``."""
    import shutil

    if exc is not None or _MATHJAX is None or app.builder.format != "html":
        return
    dest = Path(app.outdir) / "_static" / "mathjax"
    for part in _MATHJAX_PARTS:
        src = _MATHJAX / part
        if src.is_dir():
            shutil.copytree(src, dest / part, dirs_exist_ok=True)
        elif src.is_file():
            (dest / part).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / part)


def setup(app):  # noqa: ANN001, ANN201
    app.connect("missing-reference", _resolve_alias)
    app.connect("build-finished", _copy_mathjax)
    if _MATHJAX is None:
        from sphinx.util import logging

        logging.getLogger(__name__).info(
            "libjs-mathjax not found (apt-get install libjs-mathjax, or set BAYESURL_MATHJAX): "
            "formulas load MathJax from its CDN and need internet"
        )


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
# wider text column: tutorial code and tables fit without horizontal scrolling
html_theme_options = {"page_width": "1200px", "sidebar_width": "230px", "body_max_width": "none"}
html_static_path: list[str] = []
html_title = "bayesurl"
exclude_patterns = ["_build", "tutorials_src/README.rst"]
templates_path = ["_templates"]
