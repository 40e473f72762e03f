"""Sphinx configuration of the user guide and API reference (``make docs``)."""

import os
import sys

sys.path.insert(0, os.path.abspath(".."))

project = "dgl_rsc"
author = "dgl_rsc contributors"
extensions = ["sphinx.ext.autodoc", "sphinx.ext.napoleon", "myst_parser"]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["results", "journal/results"]
html_theme = "furo"
html_title = "dgl_rsc"
myst_heading_anchors = 3
# the journal keeps its entries as written: their headings skip levels
suppress_warnings = ["myst.header"]
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "show-inheritance": True}
# the PyG drop-ins subclass torch_geometric's classes; the docs build runs in .venv without it
autodoc_mock_imports = ["torch_geometric", "torch_sparse", "torch_scatter"]
napoleon_google_docstring = True
napoleon_numpy_docstring = False
html_static_path = ["_static"]
html_css_files = ["tables.css"]
# only the parameters a docstring describes get their type listed (no bare type lists)
autodoc_typehints_description_target = "documented"
