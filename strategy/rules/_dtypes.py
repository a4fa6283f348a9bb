"""torch's dtype rules over dtype names: type promotion, and the dtypes an op takes.

Pure Python (no torch import), matching torch 2.13. :func:`promote_types` is
``torch.promote_types``; :func:`result_type` is ``torch.result_type`` over tensors given
as :class:`Meta` and Python (or numpy) scalars. torch ranks operands in three tiers —
tensors with dims, 0-d tensors, scalars — and a lower tier only raises the result's
category (bool < integer < floating < complex), never its size within a category. Float
scalars take torch's default dtype, float32, and integer scalars int64
(``torch.set_default_dtype`` is global state the planner does not read).

>>> promote_types("int32", "float16"), promote_types("uint8", "int8")
('float16', 'int16')
>>> result_type("add", [Meta((4,), "int8"), Meta((), "int64")]), result_type("mul", [Meta((4,), "int64")], [2.5])
('int8', 'float32')
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from numbers import Complex, Integral, Real

from meshplan.errors import StrategyError

from ._rule import Meta

__all__ = [
    "FLOATING",
    "FLOAT8",
    "COMPLEX",
    "INTEGRAL",
    "ALL_DTYPES",
    "DEFAULT_FLOAT",
    "promote_types",
    "result_type",
    "check_dtypes",
    "same_dtype",
    "real_of",
]

FLOATING = ("float64", "float32", "float16", "bfloat16")  # what torch computes with
FLOAT8 = ("float8_e4m3fn", "float8_e5m2")  # storage formats: few ops compute with them
COMPLEX = ("complex64", "complex128")
INTEGRAL = ("int64", "int32", "int16", "int8", "uint8")
ALL_DTYPES = (*FLOATING, *FLOAT8, *COMPLEX, *INTEGRAL, "bool")
DEFAULT_FLOAT = "float32"  # torch's default dtype
DEFAULT_COMPLEX = "complex64"

_BITS = {
    "float64": 64,
    "float32": 32,
    "float16": 16,
    "bfloat16": 16,
    "complex64": 32,  # bits of each component
    "complex128": 64,
    "int64": 64,
    "int32": 32,
    "int16": 16,
    "int8": 8,
    "uint8": 8,
}
_SIGNED = {8: "int8", 16: "int16", 32: "int32", 64: "int64"}
_REAL = {"complex64": "float32", "complex128": "float64"}
_TO_COMPLEX = {"float64": "complex128", "float32": "complex64", "bfloat16": "complex64"}


def _category(dtype: str) -> int:
    """0 bool, 1 integer, 2 floating (float8 too), 3 complex: torch's category order."""
    if dtype == "bool":
        return 0
    if dtype in INTEGRAL:
        return 1
    if dtype in COMPLEX:
        return 3
    return 2


def real_of(dtype: str) -> str:
    """The real dtype of a complex one (``abs`` of complex64 is float32); others unchanged."""
    return _REAL.get(dtype, dtype)


def promote_types(a: str, b: str, op: str = "promote_types") -> str:
    """The smallest dtype both ``a`` and ``b`` convert to (``torch.promote_types``).

    >>> promote_types("float16", "bfloat16"), promote_types("complex64", "float64")
    ('float32', 'complex128')
    """
    if a == b:
        return a
    if a in FLOAT8 or b in FLOAT8:
        raise StrategyError(
            f"{op}: torch does not promote float8 dtypes ({a} with {b}); convert the "
            "inputs to one dtype first",
            value=(a, b),
        )
    ca, cb = _category(a), _category(b)
    if ca != cb:
        lo, hi = (a, b) if ca < cb else (b, a)
        return "complex128" if (lo, hi) == ("float64", "complex64") else hi
    if ca == 1:
        if "uint8" in (a, b):  # a signed int holds uint8's values from 16 bits up
            other = b if a == "uint8" else a
            return _SIGNED[max(16, _BITS[other])]
        return a if _BITS[a] >= _BITS[b] else b
    if {a, b} == {"float16", "bfloat16"}:
        return "float32"
    return a if _BITS[a] >= _BITS[b] else b


def _fold(dtypes: Iterable[str], op: str) -> str | None:
    out: str | None = None
    for d in dtypes:
        out = d if out is None else promote_types(out, d, op)
    return out


def _to_complex(dtype: str, op: str) -> str:
    out = _TO_COMPLEX.get(dtype)
    if out is None:
        raise StrategyError(
            f"{op}: the result would be the complex dtype of {dtype}, which meshplan does not "
            f"support; convert the {dtype} input to float32 first",
            value=dtype,
        )
    return out


def _combine(higher: str | None, lower: str | None, op: str) -> str | None:
    """torch's ``combine_categories``: ``lower`` (a lower tier) can only raise the category."""
    if higher is None or lower is None:
        return higher if lower is None else lower
    if higher in COMPLEX:
        return higher
    if lower in COMPLEX:
        return _to_complex(higher, op) if _category(higher) == 2 else lower
    if _category(higher) == 2:
        return higher
    if higher == "bool" or _category(lower) == 2:
        return promote_types(higher, lower, op)
    return higher


def _scalar_dtype(value: object, op: str) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, Integral):
        return "int64"
    if isinstance(value, Real):
        return DEFAULT_FLOAT
    if isinstance(value, Complex):
        return DEFAULT_COMPLEX
    raise StrategyError(f"{op}: scalar {value!r} is not a number", value=value)


def result_type(op: str, tensors: Sequence[Meta], scalars: Sequence[object] = ()) -> str:
    """The dtype torch computes ``op`` in for these tensors and scalars (``torch.result_type``).

    >>> result_type("add", [Meta((2,), "bool")], [2]), result_type("add", [Meta((2,), "float16"), Meta((), "float64")])
    ('int64', 'float16')
    """
    dims = _fold((m.dtype for m in tensors if m.ndim > 0), op)
    zeros = _fold((m.dtype for m in tensors if m.ndim == 0), op)
    wrapped = _fold((_scalar_dtype(s, op) for s in scalars), op)
    out = _combine(dims, _combine(zeros, wrapped, op), op)
    if out is None:
        raise StrategyError(f"{op}: no operands to take a dtype from", value=tensors)
    return out


def check_dtypes(op: str, inputs: Sequence[Meta], allowed: Iterable[str], what: str = "") -> None:
    """Raise unless every input's dtype is in ``allowed`` (what torch computes ``op`` for)."""
    allowed = tuple(allowed)
    for i, m in enumerate(inputs):
        if m.dtype not in allowed:
            takes = what or ", ".join(allowed)
            raise StrategyError(
                f"{op}: torch does not compute {op} for {m.dtype} (input {i}, {m!r}); it takes "
                f"{takes}: convert the input first",
                value=m,
            )


def same_dtype(op: str, inputs: Sequence[Meta]) -> str:
    """The one dtype all inputs share (ops like ``mm`` do not promote); raise otherwise."""
    dtypes = [m.dtype for m in inputs]
    if len(set(dtypes)) > 1:
        raise StrategyError(
            f"{op}: torch needs every input in one dtype, got {dtypes!r}; convert them to one "
            "dtype first",
            value=inputs,
        )
    return dtypes[0]
