"""Module attributes imported on first use (no torch here).

Packages whose planning part must import without torch name the attributes that need it
and the submodule defining each; the package's ``__getattr__`` imports that submodule
only when the attribute is first asked for.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping

__all__ = ["lazy_attributes"]


def lazy_attributes(package: str, table: Mapping[str, str]) -> Callable[[str], object]:
    """A module ``__getattr__`` serving ``name`` from ``package.<table[name]>``.

    >>> getattr_ = lazy_attributes("meshplan.layout", {"FrozenMap": "_frozen"})
    >>> getattr_("FrozenMap").__name__
    'FrozenMap'
    >>> getattr_("nothing")
    Traceback (most recent call last):
    ...
    AttributeError: module 'meshplan.layout' has no attribute 'nothing'
    """

    def __getattr__(name: str) -> object:
        module = table.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{module}"), name)

    return __getattr__
