"""What each rank sends and receives in a step: pure index bookkeeping (no torch).

Both the in-process simulator and the process-group runtime execute a step from the
same descriptions, so they agree by construction; the reference answer they are
tested against (``shard(x, dst)``) is computed independently.

A *segment list* along one tensor dim is ``((src_pos, dst_pos, length), ...)``: copy
``length`` elements from local position ``src_pos`` of the sender's source tensor to
local position ``dst_pos`` of the receiver's target tensor. A :class:`Transfer` is the
cartesian product of one segment list per tensor dim; its data travels packed in
row-major order of that product.
"""

from __future__ import annotations

import functools
import math

import attrs

from meshplan.errors import PlanError
from meshplan.placement import (
    Intervals,
    Partial,
    Replicate,
    Spec,
    is_shard_like,
    local_intervals,
)

from ._steps import Step

__all__ = [
    "Segments",
    "Transfer",
    "StepGroup",
    "step_group",
    "overlap",
    "transfers_to",
    "transfers_from",
    "local_transform",
    "LocalDim",
    "permutation",
]

Segments = tuple[tuple[int, int, int], ...]


@attrs.frozen
class Transfer:
    """Data from ``sender`` (position ``sender_pos`` in the group) for ``receiver``."""

    sender: int
    receiver: int
    sender_pos: int
    receiver_pos: int
    segments: tuple[Segments, ...]

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(sum(n for _, _, n in segs) for segs in self.segments)

    def numel(self) -> int:
        return math.prod(self.shape)


@attrs.frozen
class StepGroup:
    """The group a step runs over, as seen from one rank."""

    ranks: tuple[int, ...]  # ordered by mesh coordinate along the step's dims
    position: int  # this rank's position in ``ranks``


def step_group(step: Step, rank: int) -> StepGroup:
    """The ranks grouped with ``rank`` for ``step`` (coordinate order) and its position."""
    mesh = step.src.mesh
    group = mesh.group_of(rank, step.mesh_dims)
    return StepGroup(group, group.index(rank))


def overlap(src_ivs: Intervals, dst_ivs: Intervals) -> Segments:
    """Segments copying the common global indices of two interval lists, by dst position.

    >>> overlap(((0, 4), (8, 12)), ((2, 10),))
    ((2, 0, 2), (4, 6, 2))
    """
    out = []
    dpos = 0
    for da, db in dst_ivs:
        spos = 0
        for sa, sb in src_ivs:
            lo, hi = max(sa, da), min(sb, db)
            if lo < hi:
                out.append((spos + lo - sa, dpos + lo - da, hi - lo))
            spos += sb - sa
        dpos += db - da
    out.sort(key=lambda s: s[1])
    return tuple(out)


def _senders_for(step: Step, group: tuple[int, ...], receiver: int) -> tuple[int, ...]:
    """The group members whose data ``receiver`` reads from.

    Members differing from the receiver on a mesh dim that does not shard in ``src``
    hold copies of data someone else already sends, so only the members that agree
    with the receiver on those dims are read (deterministic, no duplicates).
    """
    src = step.src
    mesh = src.mesh
    fixed = [m for m in step.mesh_dims if not is_shard_like(src.placements[m])]
    if not fixed:
        return tuple(range(len(group)))
    rc = mesh.coordinate(receiver)
    out = []
    for pos, r in enumerate(group):
        c = mesh.coordinate(r)
        if all(c[m] == rc[m] for m in fixed):
            out.append(pos)
    return tuple(out)


def permutation(step: Step, group: tuple[int, ...]) -> dict[int, int] | None:
    """For an all_permute: receiver -> sender over ``group`` (one of the step's groups)
    when every member's target piece is exactly some member's whole source piece, one to
    one; else None. A rank that holds its own target keeps it; the others take the
    holders of their piece in group order.

    >>> from meshplan.layout import Mesh
    >>> from meshplan.placement import Replicate, Shard
    >>> mesh = Mesh.create((2, 2))
    >>> a = Spec(mesh, [Shard(0), Replicate()], (4,))
    >>> b = Spec(mesh, [Replicate(), Shard(0)], (4,))
    >>> permutation(Step((0, 1), a, b, "all_permute"), (0, 1, 2, 3))
    {0: 0, 3: 3, 1: 2, 2: 1}
    """
    return _permutation(step, tuple(group))


@functools.lru_cache(maxsize=4096)
def _permutation(step: Step, group: tuple[int, ...]) -> dict[int, int] | None:
    src, dst = step.src, step.dst
    holders: dict = {}
    for r in group:
        holders.setdefault(local_intervals(src, r), []).append(r)
    needs = {r: local_intervals(dst, r) for r in group}
    out: dict[int, int] = {}
    for r in group:  # every rank holding its own target keeps it
        if needs[r] == local_intervals(src, r):
            out[r] = r
    taken = set(out.values())
    free = {k: [r for r in v if r not in taken] for k, v in holders.items()}
    for r in group:
        if r in out:
            continue
        left = free.get(needs[r])
        if not left:
            return None
        out[r] = left.pop(0)
    return out


@functools.lru_cache(maxsize=16384)
def transfers_to(step: Step, receiver: int) -> tuple[Transfer, ...]:
    """Every transfer ``receiver`` needs for a data-moving step (gather, all_to_all, permute).

    An all_permute whose target pieces are its source pieces one to one
    (:func:`permutation`) takes each rank's target whole from one member; any other
    reads the overlaps of every member that holds part of it.

    Raises :class:`PlanError` if the group does not hold every element the receiver
    needs: the step is not a valid transform.
    """
    src, dst = step.src, step.dst
    group = step_group(step, receiver)
    need = local_intervals(dst, receiver)
    if step.collective == "all_permute":
        mapping = _permutation(step, group.ranks)
        if mapping is not None:
            sender = mapping[receiver]
            segs = tuple(overlap(h, n) for h, n in zip(local_intervals(src, sender), need, strict=True))
            if src.ndim and any(not s for s in segs):
                return ()
            pos = group.ranks.index(sender)
            return (Transfer(sender, receiver, pos, group.position, segs),)
    out = []
    got = 0
    for pos in _senders_for(step, group.ranks, receiver):
        sender = group.ranks[pos]
        have = local_intervals(src, sender)
        segs = tuple(overlap(h, n) for h, n in zip(have, need, strict=True))
        if any(not s for s in segs) and src.ndim:
            continue
        t = Transfer(sender, receiver, pos, group.position, segs)
        got += t.numel()
        out.append(t)
    want = math.prod(sum(b - a for a, b in ivs) for ivs in need)
    if got != want:
        raise PlanError(
            f"step {step} cannot deliver rank {receiver}'s data: its group "
            f"{group.ranks} holds {got} of the {want} elements it needs in {dst}",
            value=step,
        )
    return tuple(out)


@functools.lru_cache(maxsize=16384)
def transfers_from(step: Step, sender: int) -> tuple[Transfer, ...]:
    """Every transfer ``sender`` takes part in as a sender, ordered by receiver position."""
    group = step_group(step, sender)
    out = []
    for r in group.ranks:
        for t in transfers_to(step, r):
            if t.sender == sender:
                out.append(t)
    return tuple(out)


@functools.lru_cache(maxsize=16384)
def reduce_blocks(step: Step, rank: int) -> tuple[tuple[Segments, ...], ...]:
    """For a reduce_scatter: per receiver position, where its target lies in the source.

    Every member's source covers the same region (the step's dims are Partial in
    ``src``), so one description serves all senders.
    """
    src, dst = step.src, step.dst
    group = step_group(step, rank)
    have = local_intervals(src, rank)
    out = []
    for r in group.ranks:
        need = local_intervals(dst, r)
        segs = tuple(overlap(h, n) for h, n in zip(have, need, strict=True))
        got = math.prod(sum(n for _, _, n in s) for s in segs)
        want = math.prod(sum(b - a for a, b in ivs) for ivs in need)
        if got != want:
            raise PlanError(
                f"reduce_scatter step {step}: rank {r}'s target is not inside the source",
                value=step,
            )
        out.append(segs)
    return tuple(out)


@attrs.frozen
class LocalDim:
    """What a local step does along one of its mesh dims, for one rank."""

    kind: str  # "keep", "zero" (neutral fill), "scale", "unscale"
    factor: int = 1


def local_transform(step: Step, rank: int) -> tuple[Segments | None, ...] | None:
    """For a local step: per tensor dim, segments from the own source into the target.

    ``None`` for a dim means "the whole dim, unchanged". Positions of the target not
    covered are filled with the target Partial op's neutral element.
    """
    src, dst = step.src, step.dst
    have = local_intervals(src, rank)
    need = local_intervals(dst, rank)
    # A shard turning Partial spreads its own data over a larger target (the rest is
    # neutral); every other local step only cuts its own data down.
    spreads = any(
        is_shard_like(src.placements[m]) and isinstance(dst.placements[m], Partial)
        for m in step.mesh_dims
    )
    out: list[Segments | None] = []
    for d, (h, n) in enumerate(zip(have, need, strict=True)):
        if h == n:
            out.append(None)
            continue
        segs = overlap(h, n)
        moved = sum(k for _, _, k in segs)
        full = sum(b - a for a, b in (h if spreads else n))
        if moved != full and math.prod(sum(b - a for a, b in ivs) for ivs in need):
            raise PlanError(
                f"local step {step} is not local on rank {rank}: along tensor dim {d} it "
                f"needs {n} but holds {h}; this change needs communication",
                value=step,
            )
        out.append(segs)
    return tuple(out)


def partial_actions(step: Step, rank: int) -> tuple[str, float]:
    """For a local step: ("keep"|"neutral", multiplier) applied to the rank's own values.

    * ``Replicate -> Partial(sum)``: only coordinate 0 keeps the value; others hold 0.
    * ``Shard -> Partial(op)``: own data kept, the rest neutral; avg scales by ``n``.
    * ``Partial(sum) <-> Partial(avg)``: scale by ``n`` (or ``1/n``).
    * a shard placement to another that leaves every rank its piece: keep.
    """
    mesh = step.src.mesh
    coord = mesh.coordinate(rank)
    keep = True
    factor = 1.0
    for m in step.mesh_dims:
        a, b = step.src.placements[m], step.dst.placements[m]
        n = mesh.shape[m]
        if a == b:
            continue
        match (a, b):
            case (Replicate(), Partial(op="sum")):
                keep = keep and coord[m] == 0
            case (Replicate(), Partial()):
                pass
            case (_, Partial(op="avg")) if is_shard_like(a):
                factor *= n
            case (_, Partial()) if is_shard_like(a):
                pass
            case (Partial(op="sum"), Partial(op="avg")):
                factor *= n
            case (Partial(op="avg"), Partial(op="sum")):
                factor /= n
            case (Replicate(), _) if is_shard_like(b):
                pass
            case _ if is_shard_like(a) and is_shard_like(b):
                pass  # another way to say the same pieces (``local_transform`` checks)
            case _:
                raise PlanError(
                    f"local step {step} cannot turn {a} into {b} on mesh dim "
                    f"{mesh.names[m]!r} without communication",
                    value=step,
                )
    return ("keep" if keep else "neutral"), factor


def target_partial_op(spec: Spec) -> str | None:
    ops = {p.op for p in spec.placements if isinstance(p, Partial)}
    if not ops:
        return None
    return "sum" if ops <= {"sum", "avg"} else ops.pop()
