"""Layout arithmetic behind a mesh's queries, as functions of axes and offsets.

An offset of the rank map has one digit per mode; a mesh dim's coordinate is read from
the digits of its modes (:func:`digit`), and zeroing them gives the origin of the
instance holding it (:func:`origin`). Aliases are tested against and re-expressed over
a sliced layout (:func:`contained`, :func:`reindex`); an axis splits into row-major parts
(:func:`split_axis`).
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Sequence

from meshplan.errors import MeshError

from ._axis import Axis, row_major_strides
from ._compose import compose
from ._mesh_layout import MeshLayout
from ._ranks import RankMap

__all__ = ["contained", "digit", "gather", "origin", "overlapping_pair", "reindex", "split_axis"]


def gather(ranks: RankMap, offsets: Sequence[int]) -> tuple[int, ...]:
    """The ranks at ``offsets`` of the rank map, in time linear in ``len(offsets)``."""
    if isinstance(ranks, range):
        if isinstance(offsets, range):
            return tuple(ranks[offsets.start : offsets.stop : offsets.step])
        if ranks.step == 1:
            return tuple(map(ranks.start.__add__, offsets) if ranks.start else offsets)
        start, step = ranks.start, ranks.step
        return tuple(start + step * o for o in offsets)
    if len(offsets) == 1:
        return (ranks[offsets[0]],)
    return operator.itemgetter(*offsets)(ranks)


def digit(index: int, axis: Axis) -> int:
    """The coordinate of layout offset ``index`` along ``axis`` (row-major over its modes)."""
    coord = 0
    for size, stride in axis.modes:
        coord = coord * size + (index // stride) % size
    return coord


def origin(index: int, axes: Iterable[Axis]) -> int:
    """``index`` with its digits along ``axes`` zeroed: the offset of its instance's origin."""
    for axis in axes:
        for size, stride in axis.modes:
            index -= ((index // stride) % size) * stride
    return index


def overlapping_pair(chosen: Sequence[tuple[str, Axis]]) -> tuple[str, str]:
    """The names of two of the ``chosen`` (name, axis) pairs whose axes share an offset."""
    for i, (a, x) in enumerate(chosen):
        for b, y in chosen[i + 1 :]:
            if not Axis.from_modes(x.modes + y.modes).is_injective():
                return a, b
    return chosen[0][0], chosen[-1][0]


def contained(axis: Axis, layout: MeshLayout) -> bool:
    """True when every offset of ``axis`` lies in the span of ``layout``'s modes."""
    segments: list[tuple[int, int]] = []  # (stride, count): multiples of stride below stride*count
    for stride, size in sorted((d, s) for s, d in layout.modes()):
        if segments and segments[-1][0] * segments[-1][1] == stride:
            s0, c0 = segments.pop()
            segments.append((s0, c0 * size))
        else:
            segments.append((stride, size))
    for size, stride in axis.modes:
        if not any(stride % s0 == 0 and (stride // s0) * (size - 1) < c0 for s0, c0 in segments):
            return False
    return True


def reindex(axis: Axis, sub: Axis) -> Axis | None:
    """``axis`` (offsets inside the image of injective ``sub``) as a layout of sub's indices.

    Index ``j`` of the result satisfies ``sub.offset(result.offset(j)) == axis.offset(j)``;
    None when no such layout exists.
    """
    table = sorted(zip(sub.strides, sub.sizes, row_major_strides(sub.sizes), strict=True))
    pieces: list[tuple[int, int]] = []
    for size, stride in axis.modes:
        mode_pieces: list[tuple[int, int]] = []  # fastest first
        rest, pos = size, stride
        while rest > 1:
            hit = next(((d, s, n) for d, s, n in table if d <= pos < d * s and pos % d == 0), None)
            if hit is None:
                return None
            d, s, n = hit
            q = pos // d
            if rest * q <= s:
                mode_pieces.append((rest, n * q))
                break
            if s % q or rest % (s // q):
                return None
            mode_pieces.append((s // q, n * q))
            rest //= s // q
            pos = d * s
        pieces.extend(reversed(mode_pieces))
    return Axis.from_modes(pieces)


def split_axis(axis: Axis, sizes: tuple[int, ...]) -> tuple[Axis, ...] | None:
    """``axis`` cut into row-major parts of ``sizes`` (whose product is its size), or None
    when its modes do not split so (a flattening of non-adjacent dims cut across a mode).

    >>> split_axis(Axis.of(8, 1), (2, 4))
    (Axis(sizes=(2,), strides=(4,)), Axis(sizes=(4,), strides=(1,)))
    >>> split_axis(Axis.of((2, 3), (1, 2)), (3, 2)) is None   # offsets 0, 2, 4, 1, 3, 5
    True
    """
    try:
        parts = tuple(
            compose(axis, Axis.of((s,), (d,)))
            for s, d in zip(sizes, row_major_strides(sizes), strict=True)
        )
    except MeshError:
        return None
    if Axis.from_modes(m for p in parts for m in p.modes) != axis:
        return None
    return parts
