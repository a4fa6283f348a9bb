"""Built-in rules for reductions, softmax, and shape ops (cat, stack, transpose, permute, view).

Reductions: a kept dim may be sharded; a reduced dim may be sharded when the local
reductions combine into the global one — ``sum`` gives ``Partial("sum")``, ``amax``
/``amin`` give ``Partial("max"/"min")`` (every rank must hold at least one element),
``mean`` gives ``Partial("avg")`` only when every rank holds equally many elements.
Shape ops move data without arithmetic, so every ``Partial`` passes through them.
Dtypes follow torch: ``sum`` of integers is int64, ``mean`` and ``softmax`` take floating
dtypes only, ``cat``/``stack`` promote their inputs to a common dtype.

``view``/``reshape`` group the input and output dims into blocks of equal size. A
flattened block turns a shard of an inner input dim into a ``StridedShard`` of the
output dim (split factor: the size of the dims before it); outer dims must divide
evenly. A split block keeps a shard of the input dim on its first output dim when
that divides evenly.
"""

from __future__ import annotations

import math
from typing import Any

from meshplan.errors import StrategyError
from meshplan.placement import Partial

from ._args import ALL, as_int, check_count, is_float, norm_dim, norm_dims
from ._dtypes import ALL_DTYPES, COMPLEX, FLOAT8, FLOATING, INTEGRAL, check_dtypes, promote_types
from ._oprule import OpRule
from ._rule import DimStrategy, Meta, Placeholder

__all__ = ["RULES", "view_blocks", "REDUCTIONS"]

P = Partial
REDUCTIONS = ("sum", "mean", "amax", "amin")
# the input dtypes torch 2.13 computes each reduction for
REDUCTION_DTYPES: dict[str, tuple[str, ...]] = {
    "sum": tuple(d for d in ALL_DTYPES if d not in FLOAT8),
    "mean": FLOATING + COMPLEX,  # torch cannot infer a mean's dtype for integers
    "amax": FLOATING + INTEGRAL + ("bool",),  # complex numbers have no order
    "amin": FLOATING + INTEGRAL + ("bool",),
}


def _reduction_dtype(op: str, x: Meta) -> str:
    check_dtypes(op, (x,), REDUCTION_DTYPES[op])
    if op == "sum" and (x.dtype in INTEGRAL or x.dtype == "bool"):
        return "int64"  # torch sums integers in int64
    return x.dtype


def _reduce_out_dims(ndim: int, reduced: tuple[int, ...], keepdim: bool) -> dict[int, int]:
    out: dict[int, int] = {}
    for d in range(ndim):
        if d not in reduced:
            out[d] = d if keepdim else d - sum(1 for r in reduced if r < d)
    return out


def _reduction(op: str) -> OpRule:
    def parse(inputs: tuple[Meta, ...], args: dict[str, Any]) -> tuple[Meta, tuple[int, ...], bool]:
        check_count(op, inputs, 1)
        extra = set(args) - {"dim", "keepdim"}
        if extra:
            raise StrategyError(f"{op} takes dim= and keepdim=, got {sorted(extra)!r}", value=args)
        (x,) = inputs
        _reduction_dtype(op, x)
        keepdim = args.get("keepdim", False)
        if not isinstance(keepdim, bool):
            raise StrategyError(f"{op}: keepdim={keepdim!r} must be a bool", value=keepdim)
        return x, norm_dims(op, args.get("dim"), x.ndim), keepdim

    def rule(inputs: tuple[Meta, ...], **args: Any) -> list[DimStrategy]:
        x, reduced, keepdim = parse(inputs, args)
        fm = is_float(x)
        out: list[DimStrategy] = []
        kept = _reduce_out_dims(x.ndim, reduced, keepdim)
        for d in range(x.ndim):
            if d in kept:
                out.append(DimStrategy([Placeholder(kept[d])], [Placeholder(d)]))
            elif op == "sum":
                out.append(DimStrategy([P("sum")], [Placeholder(d)]))
            elif op == "mean" and fm:
                out.append(DimStrategy([P("avg")], [Placeholder(d, even=True)]))
            elif op in ("amax", "amin"):
                out.append(DimStrategy([P(op[1:])], [Placeholder(d, nonempty=True)]))
        if op in ("sum", "mean"):
            out += [DimStrategy([P(r)], [P(r)]) for r in (("sum", "avg") if fm else ("sum",))]
        elif op in ("amax", "amin"):
            out.append(DimStrategy([P(op[1:])], [P(op[1:])]))
        return out

    def outputs(inputs: tuple[Meta, ...], **args: Any) -> tuple[Meta, ...]:
        x, reduced, keepdim = parse(inputs, args)
        shape = tuple(
            1 if d in reduced else s for d, s in enumerate(x.shape) if keepdim or d not in reduced
        )
        return (Meta(shape, _reduction_dtype(op, x)),)

    return OpRule(rule, outputs)


def _softmax(op: str) -> OpRule:
    def parse(inputs: tuple[Meta, ...], args: dict[str, Any]) -> tuple[Meta, int]:
        check_count(op, inputs, 1)
        if set(args) != {"dim"}:
            raise StrategyError(f"{op} takes exactly dim=, got {sorted(args)!r}", value=args)
        check_dtypes(op, inputs, FLOATING)
        return inputs[0], norm_dim(op, args["dim"], inputs[0].ndim)

    def rule(inputs: tuple[Meta, ...], **args: Any) -> list[DimStrategy]:
        x, dim = parse(inputs, args)
        return [DimStrategy([Placeholder(d)], [Placeholder(d)]) for d in range(x.ndim) if d != dim]

    def outputs(inputs: tuple[Meta, ...], **args: Any) -> tuple[Meta, ...]:
        x, _ = parse(inputs, args)
        return (x,)

    return OpRule(rule, outputs)


def _passthrough(n_out: int, n_in: int) -> list[DimStrategy]:
    return [DimStrategy([P(op)] * n_out, [P(op)] * n_in) for op in ALL]


def _cat_parts(
    op: str, inputs: tuple[Meta, ...], args: dict[str, Any]
) -> tuple[int, tuple[int, ...], str]:
    if not inputs:
        raise StrategyError(f"{op} needs at least one tensor", value=inputs)
    if set(args) - {"dim"}:
        raise StrategyError(f"{op} takes only dim=, got {sorted(args)!r}", value=args)
    first = inputs[0]
    if op == "cat" and first.ndim == 0:
        raise StrategyError(
            f"cat cannot concatenate 0-d tensors ({list(inputs)!r}); stack them instead",
            value=inputs,
        )
    dtype = inputs[0].dtype
    for m in inputs[1:]:
        dtype = promote_types(dtype, m.dtype, op)  # torch concatenates in the common dtype
    extra = 1 if op == "stack" else 0
    dim = norm_dim(op, args.get("dim", 0), first.ndim, extra=extra)
    for m in inputs:
        same = (
            m.shape == first.shape
            if op == "stack"
            else (
                m.ndim == first.ndim
                and all(
                    a == b
                    for i, (a, b) in enumerate(zip(m.shape, first.shape, strict=False))
                    if i != dim
                )
            )
        )
        if not same:
            raise StrategyError(
                f"{op} along dim {dim}: shapes {[x.shape for x in inputs]!r} do not match",
                value=inputs,
            )
    if op == "stack":
        shape = (*first.shape[:dim], len(inputs), *first.shape[dim:])
    else:
        shape = tuple(
            sum(m.shape[dim] for m in inputs) if i == dim else s for i, s in enumerate(first.shape)
        )
    return dim, shape, dtype


def _cat(op: str) -> OpRule:
    def rule(inputs: tuple[Meta, ...], **args: Any) -> list[DimStrategy]:
        dim, _, _ = _cat_parts(op, inputs, args)
        out = []
        for d in range(inputs[0].ndim):
            if op == "cat" and d == dim:
                continue
            od = d + 1 if op == "stack" and d >= dim else d
            out.append(DimStrategy([Placeholder(od)], [Placeholder(d)] * len(inputs)))
        return out + _passthrough(1, len(inputs))

    def outputs(inputs: tuple[Meta, ...], **args: Any) -> tuple[Meta, ...]:
        _, shape, dtype = _cat_parts(op, inputs, args)
        return (Meta(shape, dtype),)

    return OpRule(rule, outputs)


def _perm(op: str, inputs: tuple[Meta, ...], args: dict[str, Any]) -> tuple[int, ...]:
    check_count(op, inputs, 1)
    nd = inputs[0].ndim
    if op == "transpose":
        if set(args) != {"dim0", "dim1"}:
            raise StrategyError(
                f"transpose takes dim0= and dim1=, got {sorted(args)!r}", value=args
            )
        a, b = norm_dim(op, args["dim0"], nd), norm_dim(op, args["dim1"], nd)
        perm = list(range(nd))
        if nd:  # a 0-D tensor transposes dim 0 (or -1) with itself, as in torch
            perm[a], perm[b] = perm[b], perm[a]
        return tuple(perm)
    if set(args) != {"dims"}:
        raise StrategyError(f"permute takes dims=, got {sorted(args)!r}", value=args)
    dims = args["dims"]
    perm = tuple(norm_dim(op, d, nd) for d in (dims if isinstance(dims, tuple | list) else (dims,)))
    if sorted(perm) != list(range(nd)):
        raise StrategyError(f"permute: dims={dims!r} is not a permutation of {nd} dims", value=dims)
    return perm


def _permute(op: str) -> OpRule:
    def rule(inputs: tuple[Meta, ...], **args: Any) -> list[DimStrategy]:
        perm = _perm(op, inputs, args)
        out = [DimStrategy([Placeholder(o)], [Placeholder(i)]) for o, i in enumerate(perm)]
        return out + _passthrough(1, 1)

    def outputs(inputs: tuple[Meta, ...], **args: Any) -> tuple[Meta, ...]:
        perm = _perm(op, inputs, args)
        return (Meta(tuple(inputs[0].shape[i] for i in perm), inputs[0].dtype),)

    return OpRule(rule, outputs)


def _view_shape(op: str, inputs: tuple[Meta, ...], args: dict[str, Any]) -> tuple[int, ...]:
    check_count(op, inputs, 1)
    if set(args) != {"shape"}:
        raise StrategyError(f"{op} takes shape=, got {sorted(args)!r}", value=args)
    given = args["shape"]
    given = tuple(given) if isinstance(given, tuple | list) else (given,)
    numel = math.prod(inputs[0].shape)
    sizes = [as_int(s) for s in given]
    if any(s is None or s < -1 for s in sizes) or sizes.count(-1) > 1:
        raise StrategyError(
            f"{op}: shape={given!r} needs ints >= 0 and at most one -1", value=given
        )
    shape = tuple(s for s in sizes if s is not None)
    known = math.prod(s for s in shape if s != -1)
    if -1 in shape:
        if known == 0 or numel % known:
            raise StrategyError(
                f"{op}: cannot infer -1 in {shape!r} for {numel} elements", value=shape
            )
        shape = tuple(numel // known if s == -1 else s for s in shape)
    if math.prod(shape) != numel:
        raise StrategyError(
            f"{op}: shape {shape!r} has {math.prod(shape)} elements, the input "
            f"{inputs[0].shape!r} has {numel}",
            value=shape,
        )
    return shape


def view_blocks(
    src: tuple[int, ...], dst: tuple[int, ...]
) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """Group dims of equal total size: ``[(input dims, output dims), ...]`` (size-1 dims left out).

    >>> view_blocks((2, 3, 4), (6, 4))
    [((0, 1), (0,)), ((2,), (1,))]
    >>> view_blocks((6,), (2, 1, 3))
    [((0,), (0, 2))]
    """
    blocks = []
    i = j = 0
    while True:
        while i < len(src) and src[i] == 1:
            i += 1
        while j < len(dst) and dst[j] == 1:
            j += 1
        if i >= len(src) or j >= len(dst):
            return blocks
        ins, outs, a, b = [i], [j], src[i], dst[j]
        i, j = i + 1, j + 1
        while a != b:
            if a < b:
                if src[i] != 1:
                    ins.append(i)
                a *= src[i]
                i += 1
            else:
                if dst[j] != 1:
                    outs.append(j)
                b *= dst[j]
                j += 1
        blocks.append((tuple(ins), tuple(outs)))


def _view(op: str) -> OpRule:
    def rule(inputs: tuple[Meta, ...], **args: Any) -> list[DimStrategy]:
        shape = _view_shape(op, inputs, args)
        src = inputs[0].shape
        out: list[DimStrategy] = []
        if math.prod(src) == 0:
            return _passthrough(1, 1)
        for ins, outs in view_blocks(src, shape):
            if len(ins) == 1 and len(outs) == 1:
                out.append(DimStrategy([Placeholder(outs[0])], [Placeholder(ins[0])]))
            elif len(outs) == 1:
                # flatten: a shard of input dim t lands in every row of the dims before it
                for t, d in enumerate(ins):
                    pre = math.prod(src[x] for x in ins[:t])
                    inner = t + 1 < len(ins)
                    ph = Placeholder(d, even=inner, aligned=not inner)
                    out.append(DimStrategy([Placeholder(outs[0], split=pre)], [ph]))
            else:
                # split (or general block): only whole rows of the first dims line up
                out.append(
                    DimStrategy(
                        [Placeholder(outs[0], even=True)],
                        [Placeholder(ins[0], even=len(ins) > 1)],
                    )
                )
        return out + _passthrough(1, 1)

    def outputs(inputs: tuple[Meta, ...], **args: Any) -> tuple[Meta, ...]:
        return (Meta(_view_shape(op, inputs, args), inputs[0].dtype),)

    return OpRule(rule, outputs)


RULES: dict[str, OpRule] = (
    {op: _reduction(op) for op in REDUCTIONS}
    | {"softmax": _softmax("softmax"), "log_softmax": _softmax("log_softmax")}
    | {"cat": _cat("cat"), "stack": _cat("stack")}
    | {"transpose": _permute("transpose"), "permute": _permute("permute")}
    | {"view": _view("view"), "reshape": _view("reshape")}
)
