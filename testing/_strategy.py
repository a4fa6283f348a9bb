"""Hypothesis strategies for op calls: a built-in op, specs of its inputs, its arguments."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import attrs
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from meshplan.layout import Mesh
from meshplan.placement import Spec

from ._mesh import as_int, as_names, mesh_strategy, meshes
from ._placement import specs

__all__ = ["OpCall", "op_calls", "BUILTIN_OPS"]


def _input_specs(value: Iterable[Spec]) -> tuple[Spec, ...]:
    if isinstance(value, str) or not isinstance(value, Iterable):
        raise InvalidArgument(f"input_specs={value!r} must be a sequence of Specs")
    out = tuple(value)
    for spec in out:
        if not isinstance(spec, Spec):
            raise InvalidArgument(f"input_specs={value!r} holds {spec!r}, which is not a Spec")
    return out


def _args(value: Iterable[tuple[str, Any]]) -> tuple[tuple[str, Any], ...]:
    if isinstance(value, str) or not isinstance(value, Iterable):
        raise InvalidArgument(f"args={value!r} must be a sequence of (name, value) pairs")
    out = tuple(tuple(a) if isinstance(a, list | tuple) else a for a in value)
    for a in out:
        if not (isinstance(a, tuple) and len(a) == 2 and isinstance(a[0], str)):
            raise InvalidArgument(f"args={value!r} holds {a!r}, which is no (name, value) pair")
    return out


def _op_name(instance: object, attribute: object, value: object) -> None:
    if not isinstance(value, str):
        raise InvalidArgument(f"op={value!r} must be an op name (a str)")


@attrs.frozen
class OpCall:
    """One call of an op: its name, its inputs' specs, its keyword arguments.

    >>> from meshplan.layout import Mesh
    >>> from meshplan.placement import Shard
    >>> a = Spec(Mesh.create(2), (Shard(0),), (4, 3))
    >>> str(OpCall("softmax", [a], [("dim", 1)]))
    'softmax(f32[4,3](S(0)), dim=1)'
    """

    op: str = attrs.field(validator=_op_name)
    input_specs: tuple[Spec, ...] = attrs.field(converter=_input_specs)
    args: tuple[tuple[str, Any], ...] = attrs.field(default=(), converter=_args)

    @property
    def kwargs(self) -> dict[str, Any]:
        return dict(self.args)

    def __str__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.args)
        ins = ", ".join(map(str, self.input_specs))
        return f"{self.op}({ins}{', ' if args else ''}{args})"


_UNARY = ("neg", "clone", "exp", "relu", "sigmoid", "tanh", "abs", "sin", "gelu", "silu")
_BINARY = ("add", "sub", "mul", "div", "maximum", "minimum")
_REDUCE = ("sum", "mean", "amax", "amin")
_EQUATIONS = ("ij,jk->ik", "bij,bjk->bik", "ij,ij->i", "ij->j", "ijk,jl->ilk", "ij,jk,kl->il")
BUILTIN_OPS = (
    "mm", "bmm", "addmm", "linear", "einsum", "embedding", *_UNARY, *_BINARY, *_REDUCE,
    "softmax", "log_softmax", "cat", "stack", "transpose", "permute", "view", "reshape",
)  # fmt: skip


def _side(max_side: int) -> st.SearchStrategy[int]:
    return st.integers(1, max_side)


def _shape(ndim_lo: int, ndim_hi: int, max_side: int) -> st.SearchStrategy[tuple[int, ...]]:
    return st.lists(_side(max_side), min_size=ndim_lo, max_size=ndim_hi).map(tuple)


@st.composite
def _shapes_and_args(draw: st.DrawFn, op: str, max_side: int):
    """(input shapes, input dtypes, args) for a built-in op."""
    s = _side(max_side)
    f = "float64"
    if op in ("mm", "bmm"):
        b, m, k, n = draw(s), draw(s), draw(s), draw(s)
        if op == "mm":
            return [(m, k), (k, n)], [f, f], {}
        return [(b, m, k), (b, k, n)], [f, f], {}
    if op == "addmm":
        m, k, n = draw(s), draw(s), draw(s)
        bias = draw(st.sampled_from([(n,), (m, n), (1, n), (m, 1)]))
        return [bias, (m, k), (k, n)], [f] * 3, {}
    if op == "linear":
        batch = draw(_shape(0, 2, max_side))
        k, n = draw(s), draw(s)
        shapes = [(*batch, k), (n, k)]
        if draw(st.booleans()):
            shapes.append((n,))
        return shapes, [f] * len(shapes), {}
    if op == "einsum":
        eq = draw(st.sampled_from(_EQUATIONS))
        lhs = eq.split("->")[0].split(",")
        sizes = {c: draw(s, label=f"size of {c}") for c in sorted(set("".join(lhs)))}
        return [tuple(sizes[c] for c in sub) for sub in lhs], [f] * len(lhs), {"equation": eq}
    if op == "embedding":
        ids = draw(_shape(1, 2, max_side))
        return [ids, (draw(s), draw(s))], ["int64", f], {}
    if op in _UNARY:
        return [draw(_shape(1, 3, max_side))], [f], {}
    if op in _BINARY:
        out = draw(_shape(1, 3, max_side))
        if op not in ("maximum", "minimum") and draw(st.booleans()):
            other = draw(st.sampled_from([2.0, -1.5, 0.5]))
            return [out], [f], {"other": other}
        drop = draw(st.integers(0, len(out) - 1))
        other = tuple(1 if draw(st.booleans()) else x for x in out[drop:])
        pair = [out, other] if draw(st.booleans()) else [other, out]
        return pair, [f, f], {}
    if op in _REDUCE:
        shape = draw(_shape(1, 3, max_side))
        dims = draw(
            st.one_of(
                st.none(),
                st.integers(-len(shape), len(shape) - 1),
                st.lists(st.integers(0, len(shape) - 1), min_size=1, unique=True).map(tuple),
            )
        )
        return [shape], [f], {"dim": dims, "keepdim": draw(st.booleans())}
    if op in ("softmax", "log_softmax"):
        shape = draw(_shape(1, 3, max_side))
        return [shape], [f], {"dim": draw(st.integers(-len(shape), len(shape) - 1))}
    if op in ("cat", "stack"):
        shape = draw(_shape(1, 3, max_side))
        n = draw(st.integers(1, 3))
        if op == "stack":
            return [shape] * n, [f] * n, {"dim": draw(st.integers(0, len(shape)))}
        dim = draw(st.integers(0, len(shape) - 1))
        shapes = [tuple(draw(s) if i == dim else x for i, x in enumerate(shape)) for _ in range(n)]
        return shapes, [f] * n, {"dim": dim}
    if op == "transpose":
        shape = draw(_shape(1, 3, max_side))
        a, b = draw(st.integers(0, len(shape) - 1)), draw(st.integers(0, len(shape) - 1))
        return [shape], [f], {"dim0": a, "dim1": b}
    if op == "permute":
        shape = draw(_shape(1, 3, max_side))
        return [shape], [f], {"dims": tuple(draw(st.permutations(range(len(shape)))))}
    if op in ("view", "reshape"):
        atoms = draw(st.lists(st.integers(1, 4), min_size=1, max_size=4))
        src, dst = draw(_grouping(atoms)), draw(_grouping(atoms))
        return [src], [f], {"shape": dst}
    raise InvalidArgument(f"no op call strategy for op {op!r}; use one of {BUILTIN_OPS!r}")


@st.composite
def _grouping(draw: st.DrawFn, atoms: list[int]) -> tuple[int, ...]:
    cuts = [draw(st.booleans()) for _ in atoms[1:]]
    out, cur = [], atoms[0]
    for a, cut in zip(atoms[1:], cuts, strict=True):
        if cut:
            out.append(cur)
            cur = a
        else:
            cur *= a
    out.append(cur)
    return tuple(out)


def op_calls(
    *,
    ops: Sequence[str] = BUILTIN_OPS,
    mesh: Mesh | st.SearchStrategy[Mesh] | None = None,
    max_side: int = 6,
    allow_strided: bool = True,
    allow_partial: bool = True,
) -> st.SearchStrategy[OpCall]:
    """Calls of built-in ops with random input specs (uneven shapes, strided shards, partials).

    ``mesh`` is a fixed mesh, a strategy for meshes, or None (1-3 dims of size 1-3, any
    rank map, maybe a flattened alias).
    Shapes have sides ``1..max_side``; reshape targets regroup the same factors.

    >>> from hypothesis import given
    >>> @given(op_calls(ops=["mm"], max_side=4))
    ... def check(call):
    ...     a, b = call.input_specs
    ...     assert a.shape[1] == b.shape[0] and a.mesh == b.mesh
    >>> check()
    """
    ops = as_names("ops", ops, BUILTIN_OPS)
    max_side = as_int("max_side", max_side, 1)
    for name, flag in [("allow_strided", allow_strided), ("allow_partial", allow_partial)]:
        if not isinstance(flag, bool):
            raise InvalidArgument(f"{name}={flag!r} must be True or False")
    mesh_st = mesh_strategy(mesh, meshes(min_dims=1, max_dims=3, max_side=3, max_aliases=1))
    return _op_calls(ops, mesh_st, max_side, allow_strided, allow_partial)


@st.composite
def _op_calls(draw: st.DrawFn, ops, mesh_st, max_side, allow_strided, allow_partial) -> OpCall:
    op = draw(st.sampled_from(ops), label="op")
    mesh = draw(mesh_st, label="mesh")
    shapes, dtypes, args = draw(_shapes_and_args(op, max_side), label="shapes and args")
    inputs = []
    for shape, dtype in zip(shapes, dtypes, strict=True):
        floating = dtype.startswith("float")
        inputs.append(
            draw(
                specs(
                    mesh=mesh,
                    shape=shape,
                    dtypes=(dtype,),
                    allow_partial=allow_partial and floating,
                    allow_strided=allow_strided and math.prod(shape) > 0,
                    max_split_factor=3,
                ),
                label="input spec",
            )
        )
    frozen = tuple(sorted(args.items()))
    return OpCall(op, tuple(inputs), frozen)
