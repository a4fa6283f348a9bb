"""What each rank holds: per-dim index intervals, chunks, local shapes and offsets (no torch).

A rank's local tensor is, along every tensor dim ``d``, the concatenation of a list of
global index intervals; the local tensor is their cartesian product (row-major). This
one representation covers uneven shards, shard orders and StridedShard alike.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Sequence
from itertools import product
from typing import Any

import attrs

from meshplan.errors import PlacementError
from meshplan.layout._ints import as_int, int_or_same

from ._spec import Spec
from ._types import Partial, Shard, StridedShard, is_shard_like

__all__ = [
    "Chunk",
    "Intervals",
    "chunk_bounds",
    "dim_intervals",
    "local_intervals",
    "local_chunks",
    "local_shape",
    "global_offset",
    "local_numel",
    "same_layout",
]

Intervals = tuple[tuple[int, int], ...]  # ((start, stop), ...) in local storage order


@attrs.frozen
class Chunk:
    """A box of the global tensor: ``offsets`` and ``sizes`` per tensor dim.

    >>> Chunk((2, 0), (2, 4)).numel()
    8
    """

    offsets: tuple[int, ...] = attrs.field(converter=lambda v: _box_ints(v, "offsets"))
    sizes: tuple[int, ...] = attrs.field(converter=lambda v: _box_ints(v, "sizes"))

    def numel(self) -> int:
        return math.prod(self.sizes)


def _box_ints(value: Any, what: str) -> tuple[int, ...]:
    """A box's ``offsets`` or ``sizes`` as a tuple of ints >= 0, or a PlacementError."""
    if type(value) is tuple and all(type(v) is int and v >= 0 for v in value):
        return value
    try:
        items = tuple(value) if not isinstance(value, str | bytes) else None
    except (TypeError, RecursionError):
        items = None
    ints = None if items is None else [as_int(v) for v in items]
    if ints is None or any(i is None or i < 0 for i in ints):
        raise PlacementError(
            f"a chunk's {what} are ints >= 0, one per tensor dim, got {value!r:.120}",
            value=value,
        )
    return tuple(ints)  # type: ignore[arg-type]


def chunk_bounds(length: int, parts: int, index: int) -> tuple[int, int]:
    """Start and stop of piece ``index`` when ``torch.chunk`` splits ``length`` into ``parts``.

    Chunks are ``ceil(length / parts)`` long; trailing ones may be short or empty.

    >>> [chunk_bounds(5, 4, i) for i in range(4)]
    [(0, 2), (2, 4), (4, 5), (5, 5)]
    """
    if type(length) is not int or type(parts) is not int or type(index) is not int:
        ints = [as_int(x) for x in (length, parts, index)]
        if None in ints:
            raise PlacementError(
                f"chunk_bounds({length!r:.60}, {parts!r:.60}, {index!r:.60}): length, parts "
                "and index are ints",
                value=(length, parts, index),
            )
        length, parts, index = ints
    if length < 0 or parts < 0 or not 0 <= index < max(parts, 1):
        raise PlacementError(
            f"chunk_bounds({length!r}, {parts!r}, {index!r}): need length >= 0, parts >= 0 "
            "and 0 <= index < parts",
            value=(length, parts, index),
        )
    size = -(-length // parts) if parts else 0
    start = min(size * index, length)
    return start, min(start + size, length)


def nonempty_chunks(length: int, parts: int) -> int:
    """How many of the ``parts`` pieces ``torch.chunk`` cuts ``length`` into are not
    empty (the others trail them).

    >>> nonempty_chunks(5, 4), nonempty_chunks(8, 10**9), nonempty_chunks(0, 3)
    (3, 8, 0)
    """
    if length <= 0 or parts <= 0:
        return 0
    size = -(-length // parts)
    return -(-length // size)


def chunk_lengths(length: int, parts: int) -> tuple[tuple[int, int], ...]:
    """The lengths of the pieces ``torch.chunk`` cuts ``length`` into, as ``(length,
    count)`` pairs (at most three: full pieces, a short one, empty ones), in O(1).

    >>> chunk_lengths(5, 4), chunk_lengths(8, 10**9)
    (((2, 2), (1, 1), (0, 1)), ((1, 8), (0, 999999992)))
    """
    if parts <= 0:
        return ()
    size = -(-length // parts) if length else 0
    full = length // size if size else 0
    rest = length - full * size
    out = [(size, full)] if full else []
    if rest:
        out.append((rest, 1))
    empty = parts - full - (1 if rest else 0)
    if empty:
        out.append((0, empty))
    return tuple(out)


def _take(intervals: Intervals, start: int, stop: int) -> Intervals:
    """Positions ``[start, stop)`` of the concatenated intervals, as intervals."""
    out: list[tuple[int, int]] = []
    pos = 0
    for a, b in intervals:
        n = b - a
        lo, hi = max(start - pos, 0), min(stop - pos, n)
        if lo < hi:
            if out and out[-1][1] == a + lo:
                out[-1] = (out[-1][0], a + hi)
            else:
                out.append((a + lo, a + hi))
        pos += n
        if pos >= stop:
            break
    return tuple(out)


def _length(intervals: Intervals) -> int:
    return sum(b - a for a, b in intervals)


def shard_intervals(
    intervals: Intervals, placement: Shard | StridedShard, parts: int, index: int
) -> Intervals:
    """Apply one shard-like placement (``parts`` ranks, this rank at ``index``) to a piece.

    >>> shard_intervals(((0, 8),), StridedShard(0, 2), 2, 1)
    ((2, 4), (6, 8))
    """
    try:
        n = _length(intervals)
    except (TypeError, ValueError, RuntimeError, RecursionError):  # not int pairs
        n = None
    if not isinstance(n, int):
        raise PlacementError(
            f"shard_intervals takes (start, stop) int intervals, got {intervals!r:.120}",
            value=intervals,
        )
    if isinstance(placement, Shard):
        return _take(intervals, *chunk_bounds(n, parts, index))
    if not isinstance(placement, StridedShard):
        raise PlacementError(
            f"shard_intervals applies a Shard or StridedShard, got {placement!r}", value=placement
        )
    sf = placement.split_factor
    if len(intervals) == 1:
        return _strided_run(intervals[0][0], n, sf, parts, index)
    out: list[tuple[int, int]] = []
    for j in range(nonempty_chunks(n, sf)):  # the rest are empty: O(n), not O(sf)
        a, b = chunk_bounds(n, sf, j)
        lo, hi = chunk_bounds(b - a, parts, index)
        for iv in _take(intervals, a + lo, a + hi):
            if out and out[-1][1] == iv[0]:
                out[-1] = (out[-1][0], iv[1])
            else:
                out.append(iv)
    return tuple(out)


def _strided_run(start: int, n: int, sf: int, parts: int, index: int) -> Intervals:
    """:func:`shard_intervals` of ``StridedShard(_, sf)`` on the one run ``[start, start +
    n)``: the ``sf`` pieces are ``k`` full ones of one length, maybe one shorter, then
    empty ones, and the rank takes the same chunk of every full piece; so a rank that
    takes a whole piece (or none) gets one run (or none) in O(1), whatever ``sf``."""
    if not n:
        return ()
    size = -(-n // sf)
    k, rem = divmod(n, size)
    lo, hi = chunk_bounds(size, parts, index)
    out: list[tuple[int, int]] = []
    if hi > lo:
        if hi - lo == size:
            out.append((start, start + k * size))
        else:
            out.extend((start + j * size + lo, start + j * size + hi) for j in range(k))
    if rem:
        rlo, rhi = chunk_bounds(rem, parts, index)
        if rhi > rlo:
            a, b = start + k * size + rlo, start + k * size + rhi
            if out and out[-1][1] == a:
                out[-1] = (out[-1][0], b)
            else:
                out.append((a, b))
    return tuple(out)


def dim_intervals(spec: Spec, coordinate: Sequence[int], tensor_dim: int) -> Intervals:
    """The global index intervals along ``tensor_dim`` (negative counts from the end)
    held at mesh ``coordinate`` (one index per mesh dim).

    >>> from meshplan.layout import Mesh
    >>> from meshplan.placement import Replicate
    >>> spec = Spec(Mesh.create((2, 2)), (Replicate(), Shard(-1)), (4, 8))
    >>> dim_intervals(spec, (0, 1), -1)
    ((4, 8),)
    """
    _need_spec(spec)
    coordinate = check_coordinate(spec, coordinate)
    return _dim_intervals(spec, coordinate, spec.tensor_dim(tensor_dim))


def check_coordinate(spec: Spec, coordinate: Sequence[int]) -> tuple[int, ...]:
    """``coordinate`` as a tuple of Python ints if it is a coordinate of ``spec``'s mesh
    (one int per mesh dim, each in ``[0, size)``); raise :class:`PlacementError` otherwise."""
    if isinstance(coordinate, str) or not isinstance(coordinate, Sequence | Iterable):
        raise PlacementError(
            f"a mesh coordinate is a sequence of ints, got {coordinate!r}", value=coordinate
        )
    coordinate = tuple(int_or_same(c) for c in coordinate)
    sizes = spec.mesh.shape
    if len(coordinate) != len(sizes) or not all(
        not isinstance(c, bool) and isinstance(c, int) and 0 <= c < n
        for c, n in zip(coordinate, sizes, strict=True)
    ):
        raise PlacementError(
            f"{coordinate!r} is not a coordinate of mesh {spec.mesh} (shape {sizes}); give "
            "one index per mesh dim, each in [0, size)",
            value=coordinate,
        )
    return coordinate


@functools.lru_cache(maxsize=65536)
def _dim_intervals(spec: Spec, coordinate: tuple[int, ...], tensor_dim: int) -> Intervals:
    size = spec.shape[tensor_dim]
    ivs: Intervals = ((0, size),) if size else ()
    for m in spec.order(tensor_dim):
        ivs = shard_intervals(ivs, spec.placements[m], spec.mesh.shape[m], coordinate[m])
    return ivs


def _need_spec(spec) -> None:
    if not isinstance(spec, Spec):
        raise PlacementError(f"expected a Spec, got {spec!r}", value=spec)


def _coordinate(spec: Spec, rank: int) -> tuple[int, ...]:
    _need_spec(spec)
    coord = spec.mesh.coordinate(rank)
    if coord is None:
        raise PlacementError(
            f"rank {rank} is not in mesh {spec.mesh}; pick a rank of its rank map", value=rank
        )
    return coord


def local_intervals(spec: Spec, rank: int) -> tuple[Intervals, ...]:
    """Per tensor dim, the global intervals rank ``rank`` holds (in local storage order).

    >>> from meshplan.layout import Mesh
    >>> spec = Spec(Mesh.create(2), (StridedShard(0, 2),), (8, 3))
    >>> local_intervals(spec, 1)
    (((2, 4), (6, 8)), ((0, 3),))
    """
    coord = _coordinate(spec, rank)
    return tuple(_dim_intervals(spec, coord, d) for d in range(spec.ndim))


def local_shape(spec: Spec, rank: int) -> tuple[int, ...]:
    """The shape of rank ``rank``'s local tensor (unpadded).

    >>> from meshplan.layout import Mesh
    >>> spec = Spec(Mesh.create(4), (Shard(0),), (5, 3))
    >>> [local_shape(spec, r) for r in range(4)]
    [(2, 3), (2, 3), (1, 3), (0, 3)]
    """
    return tuple(_length(ivs) for ivs in local_intervals(spec, rank))


def local_numel(spec: Spec, rank: int) -> int:
    """How many elements rank ``rank`` holds: the product of its :func:`local_shape`.

    >>> from meshplan.layout import Mesh
    >>> spec = Spec(Mesh.create(4), (Shard(0),), (5, 3))
    >>> [local_numel(spec, r) for r in range(4)]
    [6, 6, 3, 0]
    """
    return math.prod(local_shape(spec, rank))


def global_offset(spec: Spec, rank: int) -> tuple[int, ...]:
    """Where rank ``rank``'s data begins in the global tensor, per dim.

    The first held index along each dim; a dim holding nothing reports the dim's size
    (as torch does for empty shards).

    >>> from meshplan.layout import Mesh
    >>> spec = Spec(Mesh.create(4), (Shard(0),), (5, 3))
    >>> [global_offset(spec, r) for r in range(4)]
    [(0, 0), (2, 0), (4, 0), (5, 0)]
    """
    return tuple(
        ivs[0][0] if ivs else spec.shape[d] for d, ivs in enumerate(local_intervals(spec, rank))
    )


def local_chunks(spec: Spec, rank: int) -> tuple[Chunk, ...]:
    """Every box of the global tensor rank ``rank`` holds, in local storage order.

    One box for plain shards; several for StridedShard or uneven shard orders. A rank
    holding nothing has no boxes.

    >>> from meshplan.layout import Mesh
    >>> spec = Spec(Mesh.create(2), (StridedShard(0, 2),), (8, 3))
    >>> local_chunks(spec, 0)
    (Chunk(offsets=(0, 0), sizes=(2, 3)), Chunk(offsets=(4, 0), sizes=(2, 3)))
    """
    per_dim = local_intervals(spec, rank)
    if any(not ivs for ivs in per_dim) and spec.ndim:
        return ()
    return tuple(
        Chunk(tuple(a for a, _ in box), tuple(b - a for a, b in box)) for box in product(*per_dim)
    )


def same_layout(a: Spec, b: Spec) -> bool:
    """Whether ``a`` and ``b`` give every rank the same local tensor: the same mesh, shape
    and dtype, the same placement on each Partial mesh dim, and on every rank the same
    global indices in the same local order along every tensor dim. Such specs may still
    differ as values (a StridedShard against a shard order that chunks alike, say), but
    taking a tensor from one to the other moves and changes nothing.

    >>> from meshplan.layout import Mesh
    >>> mesh = Mesh.create((2, 2), ("dp", "tp"))
    >>> fsdp_tp = Spec(mesh, (StridedShard(0, 2), Shard(0)), (8, 4))
    >>> ordered = Spec(mesh, (Shard(0), Shard(0)), (8, 4), shard_order={0: ("tp", "dp")})
    >>> fsdp_tp == ordered, same_layout(fsdp_tp, ordered)
    (False, True)
    >>> mesh = Mesh.create((4, 2), ("dp", "tp"))
    >>> [same_layout(Spec(mesh, (StridedShard(0, 2), Shard(0)), (n, 4)),
    ...              Spec(mesh, (Shard(0), Shard(0)), (n, 4), shard_order={0: (1, 0)}))
    ...  for n in (8, 9)]
    [True, False]
    """
    _need_spec(a)
    _need_spec(b)
    # (identity, not ``==``, first: torch.compile traces the planner, and ``==`` of
    # hash-caching values breaks its graph; equal specs pass the checks below anyway)
    if a is b:
        return True
    if (a.mesh is not b.mesh and a.mesh != b.mesh) or a.shape != b.shape or a.dtype != b.dtype:
        return False
    empty = 0 in a.shape
    for x, y in zip(a.placements, b.placements, strict=True):
        if isinstance(x, Partial) or isinstance(y, Partial):
            if x != y:
                return False
        elif not empty and (
            is_shard_like(x) != is_shard_like(y) or (is_shard_like(x) and x.dim != y.dim)
        ):
            # a mesh dim sharding a tensor dim that is not empty splits it into pieces
            # that are not all alike; one sharding another dim (or none) does not
            return False
    sizes = a.mesh.shape
    for d in range(a.ndim):
        dims = sorted(set(a.order(d)) | set(b.order(d)))
        coord = [0] * len(sizes)
        for combo in product(*(range(sizes[m]) for m in dims)):
            for m, c in zip(dims, combo, strict=True):
                coord[m] = c
            here = tuple(coord)
            if _joined(_dim_intervals(a, here, d)) != _joined(_dim_intervals(b, here, d)):
                return False
    return True


def _joined(ivs: Intervals) -> Intervals:
    """``ivs`` with each interval that starts where the one before stops joined to it
    (the same indices in the same order, written one way), empty ones dropped."""
    out: list[tuple[int, int]] = []
    for lo, hi in ivs:
        if lo >= hi:
            continue
        if out and out[-1][1] == lo:
            out[-1] = (out[-1][0], hi)
        else:
            out.append((lo, hi))
    return tuple(out)
