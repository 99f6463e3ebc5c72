"""Sphinx configuration of dask-ddp's documentation site (``make docs`` writes
``build/docs/html``; warnings are errors there and in CI)."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The package is documented from the source tree, as the tests import it (the C++ module
# is built beside the sources by `make build`).
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent / "_ext"))

project = "dask-ddp"
author = "dask-ddp developers"
copyright = "dask-ddp developers"
release = version = "0.1.0"

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "numpydoc",
    "reexports",  # docs/_ext: dask_ddp.submit is dask_ddp.dispatch.submit
    "private_params",  # docs/_ext: a signature's parameters named _... are not shown
]

source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
root_doc = "index"
exclude_patterns = ["_build"]

myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

# API pages: numpydoc renders the docstrings; signatures keep their type hints.
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
# Methods that override torch's (DCP's StorageReader) would show torch's docstrings.
autodoc_inherit_docstrings = False
autodoc_default_options = {"show-inheritance": True}
autosummary_generate = False
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
numpydoc_xref_param_type = False

# -n: every reference to dask_ddp's public API must resolve. References to other projects
# (torch, distributed, the standard library) would need intersphinx, which fetches over
# the network: they are left as text; so are the private modules a docstring names for
# developers (dask_ddp._launch, ...), which the site does not document.
nitpicky = True
nitpick_ignore_regex = [(r"py:.*", r"(?!dask_ddp\b).*"), (r"py:.*", r"dask_ddp\._.*"),
                        (r"py:.*", r".*\._[a-z].*")]

html_theme = "pydata_sphinx_theme"
html_title = "dask-ddp"
html_theme_options = {
    "navigation_with_keys": False,
    "show_toc_level": 2,
}
html_static_path: list[str] = []
