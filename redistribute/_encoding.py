"""Specs as the search's states and back, and mesh aliases as the mesh dims they flatten.

A state is ``(codes, chains)``: per mesh dim a placement code (``R`` = 0 for Replicate,
1..4 for Partial sum/avg/max/min, ``(tensor dim, split factor)`` for a shard, split factor
1 for a plain ``Shard``), and per tensor dim the mesh dims sharding it, in shard order.
Equal specs encode alike, so states compare and hash as the specs do.

>>> from meshplan.placement import Partial, Shard
>>> mesh = Mesh.create((2, 2))
>>> encode(Spec(mesh, (Shard(0), Partial("avg")), (4, 4)))
State(codes=((0, 1), 2), chains=((0,), ()))
"""

from __future__ import annotations

import functools
from typing import NamedTuple

from meshplan.errors import PlanError
from meshplan.layout import FrozenMap, Mesh
from meshplan.layout._frozen import int_keyed_map
from meshplan.placement import Partial, Replicate, Shard, Spec, StridedShard

from ._heuristic import R

__all__ = ["State", "encode", "decode", "alias_dims", "MERGEABLE"]

MERGEABLE = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
"""The collectives a step merged onto a flattened alias may run."""

_OPS = ("sum", "avg", "max", "min")
_OP_CODE = {op: i + 1 for i, op in enumerate(_OPS)}


# -- encoding -------------------------------------------------------------------------------


def _code(p) -> object:
    match p:
        case Replicate():
            return R
        case Partial(op=op):
            return _OP_CODE[op]
        case StridedShard(dim=d, split_factor=sf):
            return (d, sf)
        case Shard(dim=d):
            return (d, 1)
    raise PlanError(f"unknown placement {p!r}", value=p)


@functools.cache
def _placement(code) -> object:
    if code == R:
        return Replicate()
    if type(code) is int:
        return Partial(_OPS[code - 1])
    d, sf = code
    return Shard(d) if sf == 1 else StridedShard(d, sf)


class State(NamedTuple):
    """A spec as the search holds it: a placement code per mesh dim, and per tensor dim
    the mesh dims sharding it in shard order (a tuple: it hashes and compares as one)."""

    codes: tuple
    chains: tuple


def encode(spec: Spec) -> State:
    """The state of ``spec``."""
    codes = tuple(_code(p) for p in spec.placements)
    chains = tuple(spec.order(d) for d in range(spec.ndim))
    return State(codes, chains)


def decode(template: Spec, state: tuple) -> Spec:
    """The Spec of ``state`` for the tensor and mesh of ``template``."""
    codes, chains = state
    return Spec(
        template.mesh, _placements(codes), template.shape, template.dtype, _order_map(chains)
    )


@functools.lru_cache(maxsize=4096)
def _placements(codes: tuple) -> tuple:
    return tuple(_placement(c) for c in codes)


@functools.lru_cache(maxsize=4096)
def _order_map(chains: tuple) -> FrozenMap:
    """The shard-order map of a state's chains (frozen: specs share it)."""
    return int_keyed_map({d: c for d, c in enumerate(chains) if c})


@functools.lru_cache(maxsize=1024)
def alias_dims(mesh: Mesh) -> FrozenMap:
    """Each alias of ``mesh`` as the mesh dims it flattens (in flattening order).

    Raises :class:`PlanError` for an alias that is not a flattening of mesh dims.

    >>> m = Mesh.create((2, 2, 2), ("a", "b", "c")).flatten(("a", "c"), "ac")
    >>> dict(alias_dims(m))
    {'ac': (0, 2)}
    """
    found: dict[str, tuple[int, ...]] = {}
    for name, axis in mesh.aliases.items():
        dims = _flattened_dims(mesh, axis)
        if dims is None:
            raise PlanError(
                f"alias {name!r} of {mesh} ({axis}) does not flatten any of its mesh dims "
                f"{mesh.names!r}; register aliases with mesh.flatten(dims, name)",
                value=name,
            )
        found[name] = dims
    return FrozenMap(found)


def _flattened_dims(mesh: Mesh, axis) -> tuple[int, ...] | None:
    """The mesh dims (of size > 1, slowest first) whose flattening is ``axis``, or None.

    Found from the fastest dim outwards: after dims of sizes multiplying to ``p``, the next
    one is the dim whose ``j``-th offset is the axis's ``(j * p)``-th, for every ``j`` (mesh
    dims never share an offset but 0, so at most one fits). O(dims^2 * size), where
    trying every ordered subset of dims was factorial in them.
    """
    from meshplan.layout import Axis

    axes = mesh.layout.axes
    size = axis.size()
    if size == 1:
        ones = [d for d in range(mesh.ndim) if axes[d].size() == 1]
        return (ones[0],) if ones else None
    left = [d for d in range(mesh.ndim) if axes[d].size() > 1]
    order: list[int] = []
    p = 1
    while p < size:
        fit = next(
            (
                d
                for d in left
                if size % (p * axes[d].size()) == 0
                and all(axes[d].offset(j) == axis.offset(j * p) for j in range(axes[d].size()))
            ),
            None,
        )
        if fit is None:
            return None
        order.append(fit)
        left.remove(fit)
        p *= axes[fit].size()
    dims = tuple(reversed(order))
    if Axis.from_modes(m for d in dims for m in axes[d].modes) != axis:
        return None
    return dims


def _alias_named(mesh: Mesh, dims: tuple[int, ...]) -> str:
    """The (first) alias of ``mesh`` flattening exactly ``dims``, in that order."""
    for name, adims in alias_dims(mesh).items():
        if adims == dims:
            return name
    raise PlanError(f"no alias of {mesh} flattens mesh dims {dims}", value=dims)


def _universe(src: Spec, dst: Spec, ndim: int) -> tuple[tuple, tuple]:
    """The shard codes (every Shard, the StridedShards of ``src``/``dst``) and Partial op
    codes a plan between them searches."""
    return _universe_of(encode(src)[0], encode(dst)[0], ndim)


@functools.lru_cache(maxsize=4096)
def _universe_of(codes_a: tuple, codes_b: tuple, ndim: int) -> tuple[tuple, tuple]:
    shards = [(d, 1) for d in range(ndim)]
    for c in codes_a + codes_b:
        if type(c) is tuple and c[1] > 1 and c not in shards:
            shards.append(c)
    ops = sorted({c for c in codes_a + codes_b if type(c) is int and c != R})
    return tuple(shards), tuple(ops)
