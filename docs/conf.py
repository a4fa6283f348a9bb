"""Sphinx configuration of meshplan's documentation (``python -m sphinx -W -b html docs docs/_build/html``)."""

import os
import sys

sys.path.insert(0, os.path.abspath(".."))

project = "meshplan"
author = "the meshplan authors"
copyright = "meshplan authors; BSD-3-Clause"
release = "0.1.0"

extensions = ["sphinx.ext.autodoc", "sphinx.ext.viewcode"]
root_doc = "index"
exclude_patterns = ["_build"]
templates_path: list[str] = []

autodoc_default_options = {"members": True, "show-inheritance": True}
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_preserve_defaults = True
add_module_names = False
toc_object_entries = False

html_theme = "alabaster"
html_title = "meshplan"
html_static_path: list[str] = []
html_theme_options = {"description": "functional SPMD tensor sharding for PyTorch"}


def _materialize_lazy_attributes() -> None:
    """Packages import their torch-dependent names on first use (a module ``__getattr__``);
    autodoc lists a module's members from its namespace, so load them all first."""
    import importlib

    for pkg in ("layout", "placement", "redistribute", "strategy", "runtime", "checkpoint",
                "testing", "errors"):
        module = importlib.import_module(f"meshplan.{pkg}")
        for name in getattr(module, "__all__", ()):
            setattr(module, name, getattr(module, name))


_materialize_lazy_attributes()
