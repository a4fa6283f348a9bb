"""Per-rank wire schedules of ``run``'s collective steps: pure, cached on the frozen step.

For one step and one rank: what the rank packs where in a flat send buffer and where
received pieces sit (in the torch group's rank order where the group may reorder
positions), and when the received buffer already is the target as it lands, or becomes
it by one view/permute/reshape. Computed once per (step, rank[, group order]); a repeated
run only looks them up. ``torch.compile`` keeps them as constants (see
:func:`~meshplan.redistribute._local_ops.traced_as_constant`).
"""

from __future__ import annotations

import functools
import itertools
from typing import Any

import attrs

from meshplan.placement import local_shape
from meshplan.redistribute import exchange as _exchange
from meshplan.redistribute._local_ops import traced_as_constant
from meshplan.redistribute._steps import Step
from meshplan.redistribute.exchange import Segments, step_group

transfers_to = traced_as_constant(_exchange.transfers_to)
reduce_blocks = traced_as_constant(_exchange.reduce_blocks)


@attrs.frozen
class _Gather:
    sizes: tuple[int, ...]  # numel each position contributes
    shapes: tuple[tuple[int, ...], ...]  # its local shape
    pieces: tuple[tuple[int, tuple[Segments, ...]], ...]  # (sender position, segments)
    target: tuple[int, ...]
    concat: bool  # target = the pieces concatenated in position order, row-major


@functools.lru_cache(maxsize=16384)
def _gather_schedule(step: Step, rank: int) -> _Gather:
    src = step.src
    group = step_group(step, rank)
    shapes = tuple(local_shape(src, r) for r in group.ranks)
    sizes = tuple(_prod(s) for s in shapes)
    target = local_shape(step.dst, rank)
    pieces = tuple((t.sender_pos, t.segments) for t in transfers_to(step, rank))
    return _Gather(sizes, shapes, pieces, target, _is_concat(pieces, shapes, target))


_gather_schedule = traced_as_constant(_gather_schedule)


def _is_concat(pieces, shapes, target) -> bool:
    """Whether every position's whole piece lands, in position order, one after another
    along dim 0 of the target (so the gathered buffer is the target)."""
    if not target or len(pieces) != len(shapes):
        return False
    row = 0
    for pos, (sender_pos, segs) in enumerate(pieces):
        shape = shapes[sender_pos]
        if sender_pos != pos or shape[1:] != target[1:]:
            return False
        if len(segs[0]) != 1 or segs[0][0] != (0, row, shape[0]):
            return False
        for d in range(1, len(target)):
            if segs[d] != ((0, 0, target[d]),):
                return False
        row += shape[0]
    return row == target[0]


@functools.lru_cache(maxsize=16384)
def _gather_grid(step: Step, rank: int, group_of_position: tuple[int, ...]):
    """(view, permutation) that turn the gathered buffer (whole equal pieces in torch group
    order) into the target when the pieces tile it as a grid enumerated row-major over
    some order of its dims; None otherwise."""
    plan = _gather_schedule(step, rank)
    block, target = plan.shapes[0], plan.target
    if len(set(plan.shapes)) != 1 or len(plan.pieces) != len(plan.shapes) or not target:
        return None
    if (
        len(block) != len(target)
        or 0 in block
        or any(t % b for t, b in zip(target, block, strict=True))
    ):
        return None
    counts = [t // b for t, b in zip(target, block, strict=True)]
    coords: list[Any] = [None] * len(plan.shapes)
    for pos, segs in plan.pieces:
        if any(
            len(sg) != 1 or sg[0][0] != 0 or sg[0][2] != b
            for sg, b in zip(segs, block, strict=True)
        ):
            return None
        coords[group_of_position[pos]] = tuple(
            sg[0][1] // b for sg, b in zip(segs, block, strict=True)
        )
    axes = [d for d, c in enumerate(counts) if c > 1]
    if _prod(counts) != len(coords):
        return None
    for order in itertools.permutations(axes):
        if all(coords[k] == _unravel(k, order, counts) for k in range(len(coords))):
            perm: list[int] = []
            for d in range(len(target)):
                perm += [order.index(d)] if d in order else []
                perm.append(len(order) + d)
            return (*[counts[d] for d in order], *block), tuple(perm)
    return None


_gather_grid = traced_as_constant(_gather_grid)


def _unravel(k: int, order: tuple[int, ...], counts: list[int]) -> tuple[int, ...]:
    out = [0] * len(counts)
    for d in reversed(order):
        k, out[d] = divmod(k, counts[d])
    return tuple(out)


@attrs.frozen
class _AllToAll:
    """One rank's side of an all_to_all, with both flat buffers in torch group order."""

    sends: tuple[tuple[int, int, tuple[Segments, ...]], ...]  # (offset, numel, segments)
    send_sizes: tuple[int, ...]  # numel sent to each group rank
    recvs: tuple[tuple[int, int, tuple[Segments, ...]], ...]  # (offset, numel, segments)
    recv_sizes: tuple[int, ...]  # numel received from each group rank
    target: tuple[int, ...]
    concat: bool  # the receive buffer, as it lands, is the target


@functools.lru_cache(maxsize=16384)
def _all_to_all_schedule(step: Step, rank: int, group_of_position: tuple[int, ...]) -> _AllToAll:
    """What ``rank`` packs where and reads from where; ``group_of_position[p]`` is the torch
    group rank of position ``p``."""
    size = len(group_of_position)
    target = local_shape(step.dst, rank)
    out = {}
    for side, transfers, pos_of in (
        ("send", _exchange.transfers_from(step, rank), lambda t: t.receiver_pos),
        ("recv", _exchange.transfers_to(step, rank), lambda t: t.sender_pos),
    ):
        sizes = [0] * size
        by_group = {}
        for t in transfers:
            g = group_of_position[pos_of(t)]
            sizes[g] = t.numel()
            by_group[g] = t.segments
        offsets = [sum(sizes[:g]) for g in range(size)]
        pieces = tuple((offsets[g], sizes[g], by_group[g]) for g in sorted(by_group))
        out[side] = (pieces, tuple(sizes))
    recvs = out["recv"][0]
    return _AllToAll(*out["send"], *out["recv"], target, _lands_as_target(recvs, target))


_all_to_all_schedule = traced_as_constant(_all_to_all_schedule)


def _lands_as_target(pieces, target) -> bool:
    """Whether pieces (in buffer order) are consecutive whole dim-0 slabs of the target."""
    if not target:
        return False
    row = 0
    for _, numel, segs in pieces:
        if numel == 0:
            continue
        if len(segs[0]) != 1 or segs[0][0][1] != row:
            return False
        for d in range(1, len(target)):
            if len(segs[d]) != 1 or segs[d][0][1:] != (0, target[d]):
                return False
        row += segs[0][0][2]
    return row == target[0]


@traced_as_constant
def _recv_shapes(step: Step, me: int) -> tuple[tuple[int, tuple[int, ...]], ...]:
    """(sender position, shape) of each piece this rank receives."""
    return tuple((t.sender_pos, t.shape) for t in _exchange.transfers_to(step, me))


@functools.lru_cache(maxsize=16384)
def _scatter_rows(step: Step, rank: int) -> tuple[int, ...] | None:
    """Rows of dim 0 each position keeps when the blocks are consecutive dim-0 slices
    covering the whole local tensor (so the local tensor is the wire buffer), else None."""
    blocks = reduce_blocks(step, rank)
    shape = local_shape(step.src, rank)
    if not shape:
        return None
    rows, start = [], 0
    for segs in blocks:
        if len(segs[0]) != 1 or segs[0][0][:2] != (start, 0):
            return None
        if any(segs[d] != ((0, 0, shape[d]),) for d in range(1, len(shape))):
            return None
        rows.append(segs[0][0][2])
        start += rows[-1]
    return tuple(rows) if start == shape[0] else None


_scatter_rows = traced_as_constant(_scatter_rows)


def _prod(shape) -> int:
    out = 1
    for n in shape:
        out *= n
    return out
