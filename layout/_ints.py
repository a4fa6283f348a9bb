"""Reading ints from user input (Python ints, numpy ints and 0-d int arrays, never bools),
and flags (Python or numpy bools, never ints or other truthy values)."""

from __future__ import annotations

import operator
from typing import Any

__all__ = ["as_int", "as_bool", "brief", "int_or_same"]


def as_int(value: Any) -> int | None:
    """``value`` as a Python int if it is an integer (numpy ints too, never a bool), else None.

    >>> import numpy as np
    >>> as_int(np.int64(3)), as_int(True), as_int(2.0)
    (3, None, None)
    """
    if type(value) is int:
        return value
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        return None
    try:
        return operator.index(value)
    except TypeError:  # numpy bools and arrays of several items have __index__ but refuse it
        return None


def int_or_same(value: Any) -> Any:
    """``value`` as a Python int if it is an integer, else ``value`` itself, for a check
    that names it (an attrs converter before a validator)."""
    i = as_int(value)
    return value if i is None else i


def as_bool(value: Any) -> bool | None:
    """``value`` as a Python bool if it is one (a numpy bool or 0-d bool array too), else
    None: a flag given as ``1``, ``"yes"`` or a list is refused, not read as truthy.

    >>> import numpy as np
    >>> as_bool(np.bool_(True)), as_bool(1), as_bool("no")
    (True, None, None)
    """
    if value is True or value is False:
        return value
    if (
        getattr(value, "shape", None) == ()
        and getattr(getattr(value, "dtype", None), "kind", "") == "b"
    ):
        return bool(value)
    return None


def _brief_repr():
    import reprlib

    r = reprlib.Repr()
    r.maxlevel, r.maxstring, r.maxother, r.maxlist, r.maxtuple = 4, 80, 80, 8, 8
    return r


_BRIEF = _brief_repr()


def brief(value: Any) -> str:
    """A short ``repr`` for error messages: nesting, long text and long sequences elided,
    so a message about a hostile value (a list nested thousands deep) is always printable.

    >>> brief([[[[[[1]]]]]]), brief("x" * 100)[:12]
    ('[[[[[...]]]]]', "'xxxxxxxxxxx")
    """
    try:
        return _BRIEF.repr(value)
    except Exception:  # a value whose repr fails
        return f"<{type(value).__name__}>"
