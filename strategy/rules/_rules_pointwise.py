"""Built-in rules for pointwise ops: unary, binary with broadcasting, and tensor-scalar.

Any dim of the output may be sharded when every input holding that dim (not
broadcast from size 1) is sharded the same way. ``Partial`` inputs pass through only
where the op commutes with the reduction:

* linear ops (``neg``, ``+``/``-`` of two partials, ``*``/``/`` by a replicated
  factor) keep ``sum`` and ``avg``;
* adding a replicated value or a scalar keeps ``avg``, ``max`` and ``min`` but never
  ``sum`` (it would be added once per rank);
* non-decreasing ops (``exp``, ``relu``, ``sigmoid``, ``tanh``, ``maximum`` with
  itself) keep ``max``/``min``; decreasing ones (``neg``, subtracting a partial, a
  negative scale) swap them.

Output dtypes follow torch's type promotion (``_dtypes``); dtypes torch 2.13 does not
compute an op for (``relu`` of bool, ``sub`` with bool, float8 arithmetic) are refused.
"""

from __future__ import annotations

import math
from numbers import Integral
from typing import Any

from meshplan.errors import StrategyError
from meshplan.placement import Partial, Replicate

from ._args import ALL, broadcast_shapes, check_count, is_float, is_real
from ._dtypes import (
    ALL_DTYPES,
    COMPLEX,
    DEFAULT_FLOAT,
    FLOAT8,
    FLOATING,
    INTEGRAL,
    check_dtypes,
    real_of,
    result_type,
)
from ._oprule import OpRule
from ._rule import DimPlacement, DimStrategy, Meta, Placeholder

__all__ = ["RULES", "UNARY", "BINARY", "pointwise_shards"]

P = Partial
R = Replicate

UNARY_PARTIALS: dict[str, tuple[tuple[str, str], ...]] = {
    # op: ((input partial op, output partial op), ...)
    "neg": (("sum", "sum"), ("avg", "avg"), ("max", "min"), ("min", "max")),
    "clone": tuple((op, op) for op in ALL),
    "exp": (("max", "max"), ("min", "min")),
    "relu": (("max", "max"), ("min", "min")),
    "sigmoid": (("max", "max"), ("min", "min")),
    "tanh": (("max", "max"), ("min", "min")),
    "abs": (),
    "sin": (),
    "cos": (),
    "square": (),
    "gelu": (),
    "silu": (),
}
UNARY = tuple(UNARY_PARTIALS)

# binary tensor-tensor: (out, a, b) partial triples, "" = Replicate
BINARY_PARTIALS: dict[str, tuple[tuple[str, str, str], ...]] = {
    "add": (
        ("sum", "sum", "sum"),
        ("avg", "avg", "avg"),
        ("avg", "avg", ""),
        ("avg", "", "avg"),
        ("max", "max", ""),
        ("max", "", "max"),
        ("min", "min", ""),
        ("min", "", "min"),
    ),
    "sub": (
        ("sum", "sum", "sum"),
        ("avg", "avg", "avg"),
        ("avg", "avg", ""),
        ("avg", "", "avg"),
        ("max", "max", ""),
        ("min", "", "max"),
        ("min", "min", ""),
        ("max", "", "min"),
    ),
    "mul": (("sum", "sum", ""), ("sum", "", "sum"), ("avg", "avg", ""), ("avg", "", "avg")),
    "div": (("sum", "sum", ""), ("avg", "avg", "")),
    "maximum": (("max", "max", ""), ("max", "", "max"), ("max", "max", "max")),
    "minimum": (("min", "min", ""), ("min", "", "min"), ("min", "min", "min")),
}
BINARY = tuple(BINARY_PARTIALS)


def pointwise_shards(inputs: tuple[Meta, ...], out_shape: tuple[int, ...]) -> list[DimStrategy]:
    """Shard any output dim together with the inputs that hold it (broadcast ones replicate)."""
    out: list[DimStrategy] = []
    nd = len(out_shape)
    for d in range(nd):
        ins: list[DimPlacement] = []
        for m in inputs:
            k = d - (nd - m.ndim)
            ins.append(Placeholder(k) if k >= 0 and m.shape[k] == out_shape[d] else Replicate())
        if any(isinstance(p, Placeholder) for p in ins):
            out.append(DimStrategy([Placeholder(d)], ins))
    return out


def _keeps(inputs: tuple[Meta, ...], pairs) -> list[DimStrategy]:
    out = []
    for entry in pairs:
        if "avg" in entry and not all(is_float(m) for m in inputs):
            continue  # integer avg floors: not linear
        o, *ins = entry
        out.append(DimStrategy([P(o)], [P(p) if p else R() for p in ins]))
    return out


def _scalar(op: str, args: dict[str, Any]) -> int | float | None:
    """The scalar ``other`` as a Python int or float (numpy scalars too); None if absent."""
    if "other" not in args:
        return None
    other = args["other"]
    if not is_real(other):
        raise StrategyError(f"{op}: other={other!r} must be a real number", value=other)
    return int(other) if isinstance(other, Integral) else float(other)


def _scalar_partials(op: str, c: int | float) -> tuple[tuple[str, str], ...]:
    if isinstance(c, float) and not math.isfinite(c):
        return ()
    if op in ("add", "sub"):
        return (("avg", "avg"), ("max", "max"), ("min", "min"))
    if op == "div" and c == 0:
        return ()
    keep = (("sum", "sum"), ("avg", "avg"))
    if op in ("mul", "div"):
        if c >= 0:
            return keep + (("max", "max"), ("min", "min"))
        return keep + (("max", "min"), ("min", "max"))
    return ()


_NO_FLOAT8 = tuple(d for d in ALL_DTYPES if d not in FLOAT8)
# the input dtypes torch 2.13 computes each unary op for
UNARY_DTYPES: dict[str, tuple[str, ...]] = {
    "neg": tuple(d for d in _NO_FLOAT8 if d != "bool"),
    "clone": ALL_DTYPES,
    **dict.fromkeys(("exp", "sigmoid", "tanh", "sin", "cos", "square"), _NO_FLOAT8),
    "relu": FLOATING + INTEGRAL,
    "abs": tuple(d for d in ALL_DTYPES if d != "bool"),
    "gelu": FLOATING,
    "silu": FLOATING + COMPLEX,
}
_TO_FLOAT = {"exp", "sigmoid", "tanh", "sin", "cos", "div"}  # integer inputs give float32


def _unary_dtype(op: str, x: Meta) -> str:
    check_dtypes(op, (x,), UNARY_DTYPES[op])
    if op in _TO_FLOAT and (x.dtype in INTEGRAL or x.dtype == "bool"):
        return DEFAULT_FLOAT
    if op == "abs":
        return real_of(x.dtype)
    if op == "square" and x.dtype == "bool":
        return "int64"  # x ** 2 with an int exponent
    return x.dtype


def _binary_dtype(op: str, inputs: tuple[Meta, ...], other: int | float | None) -> str:
    """torch's result dtype of a binary op; raise where torch refuses the dtypes."""
    dtypes = [m.dtype for m in inputs]
    refused = {
        "sub": ("bool",),  # torch refuses subtracting with bool tensors
        "maximum": COMPLEX,  # complex numbers have no order
        "minimum": COMPLEX,
    }.get(op, ())
    for d in dtypes:
        if d in refused:
            raise StrategyError(
                f"{op}: torch does not compute {op} for {d} inputs (got {dtypes!r}); convert "
                "the inputs to another dtype first",
                value=inputs,
            )
    out = result_type(op, inputs, () if other is None else (other,))
    if out in FLOAT8 and not (op == "mul" and other is None and inputs[1].ndim > 0):
        # torch 2.13 multiplies float8 tensors but has no other float8 arithmetic kernel (nor
        # a float8 scalar product, which it runs when the second operand is 0-d)
        raise StrategyError(
            f"{op}: torch does not compute {op} in {out} (inputs {dtypes!r}); convert the "
            "inputs to bfloat16 or float32 first",
            value=inputs,
        )
    if op in _TO_FLOAT and (out in INTEGRAL or out == "bool"):
        return DEFAULT_FLOAT  # true division
    return out


def _unary(op: str) -> OpRule:
    def rule(inputs: tuple[Meta, ...], **args: Any) -> list[DimStrategy]:
        check_count(op, inputs, 1)
        if args:
            raise StrategyError(f"{op} takes no arguments, got {sorted(args)!r}", value=args)
        (x,) = inputs
        _unary_dtype(op, x)
        out = pointwise_shards(inputs, x.shape)
        return out + _keeps(inputs, ((o, i) for i, o in UNARY_PARTIALS[op]))

    def outputs(inputs: tuple[Meta, ...], **args: Any) -> tuple[Meta, ...]:
        check_count(op, inputs, 1)
        return (Meta(inputs[0].shape, _unary_dtype(op, inputs[0])),)

    return OpRule(rule, outputs)


def _binary(op: str) -> OpRule:
    def rule(inputs: tuple[Meta, ...], **args: Any) -> list[DimStrategy]:
        c = _check(inputs, args)
        _binary_dtype(op, inputs, c)
        shape = _shape(inputs)
        out = pointwise_shards(inputs, shape)
        if c is None:
            return out + _keeps(inputs, BINARY_PARTIALS[op])
        return out + _keeps(inputs, ((o, i) for i, o in _scalar_partials(op, c)))

    def _check(inputs: tuple[Meta, ...], args: dict[str, Any]) -> int | float | None:
        extra = set(args) - {"other"}
        if extra:
            raise StrategyError(f"{op} takes only other=, got {sorted(extra)!r}", value=args)
        c = _scalar(op, args)
        if c is not None and op in ("maximum", "minimum"):
            raise StrategyError(f"{op} takes two tensors, not a scalar other=", value=args)
        check_count(op, inputs, 1 if c is not None else 2)
        return c

    def _shape(inputs: tuple[Meta, ...]) -> tuple[int, ...]:
        return broadcast_shapes(op, [m.shape for m in inputs])

    def outputs(inputs: tuple[Meta, ...], **args: Any) -> tuple[Meta, ...]:
        c = _check(inputs, args)
        return (Meta(_shape(inputs), _binary_dtype(op, inputs, c)),)

    return OpRule(rule, outputs)


RULES: dict[str, OpRule] = {op: _unary(op) for op in UNARY} | {op: _binary(op) for op in BINARY}
