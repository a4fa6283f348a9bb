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
"""

from __future__ import annotations

import math
from numbers import Real
from typing import Any

from meshplan.errors import StrategyError
from meshplan.placement import Partial, Replicate

from ._args import ALL, broadcast_shapes, check_count, is_float
from ._rule import DimPlacement, DimStrategy, Meta, Placeholder
from ._ruleset import OpRule

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


def _scalar(op: str, args: dict[str, Any]) -> float | None:
    if "other" not in args:
        return None
    other = args["other"]
    if isinstance(other, bool) or not isinstance(other, Real):
        raise StrategyError(f"{op}: other={other!r} must be a real number", value=other)
    return float(other)


def _scalar_partials(op: str, c: float) -> tuple[tuple[str, str], ...]:
    if not math.isfinite(c):
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


_FLOAT_RESULT = {"exp", "sigmoid", "tanh", "sin", "cos", "gelu", "silu", "div"}


def _result(op: str, meta: Meta) -> Meta:
    """Integer inputs give float32 results for ops that leave the integers."""
    if op in _FLOAT_RESULT and not is_float(meta):
        return Meta(meta.shape, "float32")
    return meta


def _unary(op: str) -> OpRule:
    def rule(inputs: tuple[Meta, ...], **args: Any) -> list[DimStrategy]:
        check_count(op, inputs, 1)
        if args:
            raise StrategyError(f"{op} takes no arguments, got {sorted(args)!r}", value=args)
        (x,) = inputs
        out = pointwise_shards(inputs, x.shape)
        return out + _keeps(inputs, ((o, i) for i, o in UNARY_PARTIALS[op]))

    def outputs(inputs: tuple[Meta, ...], **args: Any) -> tuple[Meta, ...]:
        check_count(op, inputs, 1)
        return (_result(op, inputs[0]),)

    return OpRule(rule, outputs)


def _binary(op: str) -> OpRule:
    def rule(inputs: tuple[Meta, ...], **args: Any) -> list[DimStrategy]:
        c = _check(inputs, args)
        shape = _shape(inputs)
        out = pointwise_shards(inputs, shape)
        if c is None:
            return out + _keeps(inputs, BINARY_PARTIALS[op])
        return out + _keeps(inputs, ((o, i) for i, o in _scalar_partials(op, c)))

    def _check(inputs: tuple[Meta, ...], args: dict[str, Any]) -> float | None:
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
        _check(inputs, args)
        return (_result(op, Meta(_shape(inputs), inputs[0].dtype)),)

    return OpRule(rule, outputs)


RULES: dict[str, OpRule] = {op: _unary(op) for op in UNARY} | {op: _binary(op) for op in BINARY}
