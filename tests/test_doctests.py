"""Every docstring example in the package runs (and is right)."""

import doctest
import importlib
import pkgutil

import pytest

PACKAGES = [
    "meshplan.errors",
    "meshplan.layout",
    "meshplan.placement",
    "meshplan.redistribute",
    "meshplan.strategy",
    "meshplan.runtime",
    "meshplan.checkpoint",
    "meshplan.testing",
]


def _modules():
    for name in PACKAGES:
        pkg = importlib.import_module(name)
        yield name
        for info in pkgutil.walk_packages(pkg.__path__, prefix=name + "."):
            yield info.name


@pytest.mark.parametrize("module_name", sorted(set(_modules())))
def test_docstring_examples_run(module_name):
    module = importlib.import_module(module_name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0, f"{result.failed} doctest(s) failed in {module_name}"
