"""The API reference (``docs/``, built with Sphinx) has an entry for every public name, and
its signatures show real defaults (not the texts attrs generates its ``__init__`` from)."""

from __future__ import annotations

import importlib
import io
import pathlib
import sys

import pytest

DOCS = pathlib.Path(__file__).resolve().parent.parent / "docs"
PACKAGES = (
    "layout",
    "placement",
    "redistribute",
    "strategy",
    "runtime",
    "checkpoint",
    "testing",
    "errors",
)
# texts a signature or a docstring must never show: attrs' generated defaults, and the
# docstrings of builtin types autodoc would give a constant that has none
NEVER = ("attr_dict[", "NOTHING", "Built-in immutable sequence", "new empty dictionary")

pytestmark = pytest.mark.slow  # one Sphinx build of the whole reference (~15 s)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The reference built as text: (the py domain's object names, every page's text)."""
    from sphinx.application import Sphinx

    out = tmp_path_factory.mktemp("docs")
    warnings = io.StringIO()
    app = Sphinx(
        str(DOCS),
        str(DOCS),
        str(out / "text"),
        str(out / "doctrees"),
        "text",
        status=None,
        warning=warnings,
        freshenv=True,
    )
    app.build()
    names = set(app.env.get_domain("py").objects)
    pages = {p.name: p.read_text() for p in (out / "text").rglob("*.txt")}
    return names, pages, warnings.getvalue()


def public_names():
    for pkg in PACKAGES:
        module = importlib.import_module(f"meshplan.{pkg}")
        for name in module.__all__:
            yield f"meshplan.{pkg}.{name}"


def test_every_public_name_has_an_entry(built):
    names, _, _ = built
    missing = [name for name in public_names() if name not in names]
    assert not missing, f"no entry in the API reference for {missing}"


def test_no_page_shows_generated_defaults_or_builtin_docstrings(built):
    _, pages, _ = built
    found = {
        page: [line.strip() for line in text.splitlines() if any(n in line for n in NEVER)]
        for page, text in pages.items()
    }
    assert not {page: lines for page, lines in found.items() if lines}


def test_the_reference_builds_without_warnings(built):
    assert built[2] == ""


def test_attrs_signature_keeps_a_hand_written_init_and_names_factories():
    sys.path.insert(0, str(DOCS))
    try:
        conf = importlib.import_module("conf")
    finally:
        sys.path.remove(str(DOCS))
    from meshplan.layout import Mesh
    from meshplan.placement import Partial, PartitionSpec

    assert conf.attrs_signature(PartitionSpec) is None  # its own __init__(*dims, partial=None)
    assert str(conf.attrs_signature(Partial)) == "(op: 'str' = 'sum')"
    assert "aliases=FrozenMap()" in str(conf.attrs_signature(Mesh))
