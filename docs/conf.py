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

    for pkg in (
        "layout",
        "placement",
        "redistribute",
        "strategy",
        "runtime",
        "checkpoint",
        "testing",
        "errors",
    ):
        module = importlib.import_module(f"meshplan.{pkg}")
        for name in getattr(module, "__all__", ()):
            setattr(module, name, getattr(module, name))


_materialize_lazy_attributes()


# -- signatures of attrs classes ------------------------------------------------------------
# attrs writes each class's ``__init__`` with defaults read from its fields
# (``attr_dict['x'].default``) and ``NOTHING`` for a factory; with
# ``autodoc_preserve_defaults`` those texts would be the documented defaults. The signature
# is rebuilt from the fields instead: a default's repr, or the factory that makes it.


class _Shown:
    """A default rendered as given text (``dict()``, ``<computed>``)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def _shown_default(field):
    import attrs

    default = field.default
    if isinstance(default, attrs.Factory):
        if default.takes_self:
            return _Shown("<computed>")
        name = getattr(default.factory, "__name__", None)
        return _Shown(f"{name}()" if name and name != "<lambda>" else "<computed>")
    return default


def attrs_signature(cls):
    """The signature of an attrs class's ``__init__`` with its fields' real defaults, or
    None for any other class."""
    import inspect

    import attrs

    if not (isinstance(cls, type) and attrs.has(cls)):
        return None
    code = getattr(cls.__init__, "__code__", None)
    if code is None or not code.co_filename.startswith("<attrs generated"):
        return None  # a hand-written __init__ (its defaults are its own)
    fields = {f.alias or f.name.lstrip("_"): f for f in attrs.fields(cls) if f.init}
    sig = inspect.signature(cls)
    params = [
        p.replace(default=_shown_default(fields[p.name]))
        if p.name in fields and p.default is not inspect.Parameter.empty
        else p
        for p in sig.parameters.values()
    ]
    return sig.replace(parameters=params, return_annotation=inspect.Signature.empty)


def _process_signature(app, what, name, obj, options, signature, return_annotation):
    from sphinx.util.inspect import stringify_signature

    if what != "class" or signature is None:
        return None
    sig = attrs_signature(obj)
    if sig is None:
        return None
    return stringify_signature(sig, show_return_annotation=False), return_annotation


def _process_docstring(app, what, name, obj, options, lines):
    """A constant or type alias has no docstring of its own: autodoc would show its type's
    (``tuple``'s, ``dict``'s); drop it, the reference's text says what it is."""
    import inspect

    if what != "data" or not lines:
        return
    types = (type(obj), getattr(obj, "__origin__", None))  # tuple[...]: tuple's docstring
    inherited = {(inspect.getdoc(t) or "").strip() for t in types if isinstance(t, type)}
    if "\n".join(lines).strip() in inherited:
        lines.clear()


def setup(app):
    app.connect("autodoc-process-signature", _process_signature)
    app.connect("autodoc-process-docstring", _process_docstring)
