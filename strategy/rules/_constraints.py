"""Placeholder constraints on sharded tensor dims: ``even``, ``nonempty``, ``aligned``.

A tensor dim sharded by several mesh dims is cut in stages, in shard order; a
constraint holds when it holds at every stage for every piece length the previous
stages leave (``even``: every cut is even; ``nonempty``: no rank is left an empty
piece; ``aligned``: a ``StridedShard``'s split factor divides the piece it splits).
"""

from __future__ import annotations

from collections.abc import Sequence

from meshplan.errors import StrategyError
from meshplan.placement import Placement, Shard, Spec, StridedShard, chunk_bounds
from meshplan.placement._local import chunk_lengths

from ._args import as_int
from ._rule import CONSTRAINTS

__all__ = ["chain_ok", "check_constraint"]


def _stage(length: int, p: Placement, parts: int) -> list[int]:
    """Lengths each coordinate keeps when ``p`` cuts a piece of ``length`` over ``parts``."""
    if not isinstance(p, StridedShard):
        return [b - a for a, b in (chunk_bounds(length, parts, c) for c in range(parts))]
    pieces = chunk_lengths(length, p.split_factor)  # (length, count): O(1) in split_factor
    return [sum(k * _part(n, parts, c) for n, k in pieces) for c in range(parts)]


def _part(n: int, parts: int, c: int) -> int:
    a, b = chunk_bounds(n, parts, c)
    return b - a


def check_constraint(spec: Spec, dim: int, name: str) -> bool:
    """Whether ``spec`` meets a placeholder constraint on tensor ``dim``.

    >>> from meshplan.layout import Mesh
    >>> spec = Spec(Mesh.create(4), (Shard(0),), (7,))   # chunks of 2, 2, 2, 1
    >>> check_constraint(spec, 0, "even"), check_constraint(spec, 0, "nonempty")
    (False, True)
    >>> check_constraint(Spec(Mesh.create(4), (Shard(0),), (6,)), 0, "nonempty")  # 2, 2, 2, 0
    False
    """
    if not isinstance(spec, Spec):
        raise StrategyError(f"check_constraint needs a Spec, got {spec!r}", value=spec)
    d = as_int(dim)
    nd = len(spec.shape)
    if d is None or not -nd <= d < nd:
        raise StrategyError(
            f"dim {dim!r} is not a tensor dim of {spec} (shape {spec.shape!r}); use an int in "
            f"[{-nd}, {nd})",
            value=dim,
        )
    if name not in CONSTRAINTS:
        raise StrategyError(f"unknown constraint {name!r}; use one of {CONSTRAINTS!r}", value=name)
    dim = d % nd
    sizes = spec.mesh.shape
    stages = [(spec.placements[m], sizes[m]) for m in spec.order(dim)]
    return chain_ok(spec.shape[dim], stages, name)


def chain_ok(length: int, stages: Sequence[tuple[Placement, int]], name: str) -> bool:
    lengths = {length}
    for p, parts in stages:
        new: set[int] = set()
        for n in lengths:
            if name == "even" and (
                n % parts
                if isinstance(p, Shard)
                else n % p.split_factor or (n // p.split_factor) % parts
            ):
                return False
            if name == "aligned" and isinstance(p, StridedShard) and n % p.split_factor:
                return False
            new.update(_stage(n, p, parts))
        lengths = new
    if name == "nonempty":
        return min(lengths) >= 1
    return True
