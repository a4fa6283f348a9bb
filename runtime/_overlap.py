"""When a program's collectives start, and which start together: the launch schedule.

:func:`~meshplan.runtime.run_program` does not run a move where its value is first read
and wait for it there. A move that is one collective (all_reduce, reduce_scatter or
all_gather) starts as soon as its input exists, at most ``prefetch`` ops ahead of its
first reader, and the runner waits for it only where that reader runs, so the
collective travels while the ops in between compute. Moves of the same kind on the same
group (and reduction and dtype) that may start within ``GATHER_OPS`` ops of each other
start as one bucket, where all their inputs exist and before any first reader:
one flat buffer, one collective (the way FSDP2 reduces many small gradients at once), up
to ``bucket_bytes`` per bucket.

The schedule is a pure function of the program and those two numbers, never of the rank
or of timing: every rank starts the same collectives in the same order, so no rank waits
on a collective another rank issues later. Other moves (several steps, all_to_all,
permutes, dtypes a backend lacks) run where they are first read, as before.

>>> from meshplan.layout import Mesh
>>> from meshplan.placement import Partial, Spec
>>> from meshplan.strategy import plan_program
>>> p = Spec(Mesh.create((4,)), [Partial()], (4,), "float64")  # partial sums: reduced first
>>> prog = plan_program(lambda p, q: (p.exp() * q.exp()).sum(), p, p)
>>> [(launch.kind, len(launch.moves)) for launch in launches(prog, "forward")[0]]
[('all_reduce', 2)]
>>> [len(launch.moves) for launch in launches(prog, "forward", bucket_bytes=0)[0]]
[1, 1]
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any, NamedTuple

import attrs

from meshplan.errors import RuntimeShellError
from meshplan.placement import Replicate, Spec, dtype_itemsize

__all__ = [
    "BUCKET_BYTES",
    "PREFETCH",
    "Launch",
    "check_options",
    "launches",
    "releases",
    "saved_for_backward",
]

BUCKET_BYTES = 25 * 2**20
"""Default cap of one bucket: 25 MiB of local input (FSDP2's and DDP's default size)."""

SEGMENT_BYTES = 2**20
"""gloo's ring all_reduce splits a buffer into ``2 * n`` segments over ``n`` ranks while a
segment stays under 1 MiB (more segments past it). A bucket of reductions over 3+ ranks
holds at most ``n`` times this, so that it and each of its moves split alike and every
element is summed in the order it is alone (two ranks' sums do not depend on order)."""

PREFETCH = 64
"""Default: a collective starts at most this many ops ahead of its first reader (what it
moves stays in memory from then on)."""

GATHER_OPS = 8
"""A collective may start up to this many ops later than it could (or earlier than its
prefetch window), to travel in one bucket with moves that start near it (a layer's
gradients, the parameters a layer gathers)."""

# collectives a bucket merges; the others run where they are read
_BUCKETED = ("all_reduce", "reduce_scatter", "all_gather")
# dtypes every backend moves and reduces (gloo and NCCL); others take run()'s stand-ins
_NATIVE = {
    "float64",
    "float32",
    "float16",
    "bfloat16",
    "complex64",
    "complex128",
    "int64",
    "int32",
    "int8",
    "uint8",
    "bool",
}


@attrs.frozen
class Launch:
    """Moves started together as one collective: ``kind`` on the group of ``group_key``
    (its mesh dims or alias), reducing with ``op`` (None for all_gather), of ``dtype``;
    ``moves`` pairs each moved value's key (value, target spec) with its one-step plan."""

    kind: str
    group_key: Any
    op: str | None
    dtype: str
    moves: tuple[tuple[Any, Any], ...]


def check_options(bucket_bytes: Any, prefetch: Any) -> None:
    """Raise unless ``bucket_bytes`` is an int >= 0 and ``prefetch`` an int >= 0 or None."""
    if type(bucket_bytes) is not int or bucket_bytes < 0:
        raise RuntimeShellError(
            f"bucket_bytes={bucket_bytes!r} must be an int >= 0 (bytes of local input one "
            "bucketed collective carries at most; 0 starts every collective alone)",
            value=bucket_bytes,
        )
    if prefetch is not None and (type(prefetch) is not int or prefetch < 0):
        raise RuntimeShellError(
            f"prefetch={prefetch!r} must be an int >= 0 (how many ops ahead of its first "
            "reader a collective may start; 0: just before it) or None (as soon as its input "
            "exists)",
            value=prefetch,
        )


_SCHEDULES: weakref.WeakKeyDictionary[Any, dict] = weakref.WeakKeyDictionary()


def launches(
    program: Any, phase: str, *, bucket_bytes: int = BUCKET_BYTES, prefetch: int | None = PREFETCH
) -> tuple[tuple[Launch, ...], ...]:
    """The launches of one phase of ``program``: entry ``i`` starts right before the
    phase's op ``i``, the last entry before the phase's final reads (outputs, gradients).

    ``phase``: ``"forward"`` (forward ops, then the outputs), ``"backward"`` (backward ops,
    then the gradients; moves the forward already made are not made again) or ``"all"``
    (every op in order, then outputs and gradients: the simulator's single pass).
    Computed once per program and options.
    """
    check_options(bucket_bytes, prefetch)
    memo = _SCHEDULES.setdefault(program, {})
    key = (phase, bucket_bytes, prefetch)
    found = memo.get(key)
    if found is None:
        found = memo[key] = _schedule(program, phase, bucket_bytes, prefetch)
    return found


def _phase_reads(program: Any, phase: str):
    """(ops, reads, keys made before): reads as (index, value, plan), index = the op."""
    graph = program.graph
    outs = list(zip(graph.outputs, program.out_moves, strict=True))
    grads = [
        (v, p)
        for v, p, s in zip(graph.grads, program.grad_moves, program.grad_specs, strict=True)
        if s is not None
    ]
    if phase == "forward":
        ops, tail, before = program.forward_ops, outs, set()
    elif phase == "backward":
        ops, tail = program.backward_ops, grads
        before = set(_first_reads(program.forward_ops, outs))
    elif phase == "all":
        ops, tail, before = program.ops, outs + grads, set()
    else:
        raise RuntimeShellError(f"unknown phase {phase!r}", value=phase)
    return ops, _first_reads(ops, tail), before


def _first_reads(ops: Sequence[Any], tail: Sequence[tuple[Any, Any]]) -> dict:
    """Each moved value's key -> (index of its first reader, plan), in reading order."""
    first: dict = {}
    reads = [(i, zip(op.inputs, op.moves, strict=True)) for i, op in enumerate(ops)]
    reads.append((len(ops), tail))
    for i, pairs in reads:
        for v, plan in pairs:
            if plan is not None and v is not None:
                first.setdefault((v, plan.dst), (i, plan))
    return first


def _launch_kind(plan: Any) -> tuple | None:
    """(kind, group key, op, dtype) of a move that starts early and buckets, else None."""
    steps = getattr(plan, "steps", ())
    if len(steps) != 1 or plan.src.dtype not in _NATIVE:
        return None
    step = steps[0]
    if step.collective not in _BUCKETED:
        return None
    op = None
    if step.collective != "all_gather":
        ops = {getattr(step.src.placements[m], "op", None) for m in step.mesh_dims}
        if not ops or None in ops or (len(ops) > 1 and not ops <= {"sum", "avg"}):
            return None
        op = "sum" if ops <= {"sum", "avg"} else ops.pop()
    group_key = step.alias if step.alias is not None else tuple(step.mesh_dims)
    return (step.collective, group_key, op, plan.src.dtype)


def wire_bytes(spec: Spec) -> int:
    """About the largest local size of ``spec`` in bytes (the same number on every rank:
    each tensor dim's length divided, rounded up, by the mesh dims that split it)."""
    n = dtype_itemsize(spec.dtype)
    parts = [1] * len(spec.shape)
    for m, p in enumerate(spec.placements):
        dim = getattr(p, "dim", None)
        if dim is not None and not isinstance(p, Replicate):
            parts[dim] *= spec.mesh.shape[m]
    for length, k in zip(spec.shape, parts, strict=True):
        n *= -(-length // k)
    return n


class _Move(NamedTuple):
    """One move that may start early: where it may start at the earliest (``start``), when
    its input exists (``ready``), its first reader (``deadline``), its reading order."""

    start: int
    ready: int
    deadline: int
    order: int
    key: Any
    plan: Any
    kind: tuple
    size: int


def _schedule(program: Any, phase: str, cap: int, prefetch: int | None):
    ops, first, before = _phase_reads(program, phase)
    ready = {}
    for i, op in enumerate(ops):
        for j in range(len(op.output_specs)):
            ready[_value(op.node, j)] = i + 1
    moves = []
    for order, (key, (deadline, plan)) in enumerate(first.items()):
        kind = None if key in before else _launch_kind(plan)
        if kind is None:
            continue
        r = ready.get(key[0], 0)
        start = r if prefetch is None else max(r, deadline - prefetch)
        moves.append(_Move(start, r, deadline, order, key, plan, kind, wire_bytes(plan.src)))
    moves.sort(key=lambda m: (m.start, m.order))
    out: list[list[Launch]] = [[] for _ in range(len(ops) + 1)]
    taken: set = set()
    for k, m in enumerate(moves):
        if m.key in taken:
            continue
        taken.add(m.key)
        members, at, size = [m], m.start, m.size
        room = _room(m.plan, m.kind, cap)
        latest = min(m.deadline, m.start + GATHER_OPS)
        for c in moves[k + 1 :] if room > 0 else ():
            if c.start > latest + GATHER_OPS:
                break
            # a later move joins if the bucket can start when both inputs exist, at most
            # GATHER_OPS ops from either's earliest start and before either's first
            # reader, and has room
            limit = min(latest, c.deadline, c.start + GATHER_OPS)
            point = max(at, c.ready)
            if c.kind != m.kind or c.key in taken or point > limit:
                continue
            if c.start <= point + GATHER_OPS and size + c.size <= room:
                taken.add(c.key)
                members.append(c)
                at, latest, size = point, limit, size + c.size
        launch = Launch(*m.kind, moves=tuple((x.key, x.plan) for x in members))
        out[at].append(launch)
    return tuple(tuple(x) for x in out)


def _room(plan: Any, kind: tuple, cap: int) -> int:
    """The bytes a bucket of ``kind`` may hold (see SEGMENT_BYTES)."""
    step = plan.steps[0]
    n = 1
    for m in step.mesh_dims:
        n *= plan.src.mesh.shape[m]
    if kind[0] == "all_gather" or n <= 2 or kind[2] in ("max", "min"):
        return cap
    return min(cap, n * SEGMENT_BYTES)


# -- when values die ---------------------------------------------------------------------


def saved_for_backward(program: Any) -> frozenset:
    """The values the backward reads (its ops' inputs and the gradients), of those the
    forward has: what the forward keeps for it, and nothing else."""
    memo = _SCHEDULES.setdefault(program, {})
    found = memo.get("saved")
    if found is None:
        reads = {v for op in program.backward_ops for v in op.inputs}
        reads.update(v for v in program.graph.grads if v is not None)
        found = memo["saved"] = frozenset(reads)
    return found


def releases(program: Any, phase: str) -> tuple[tuple[Any, ...], ...]:
    """Entry ``i``: the values of ``phase`` (``"forward"`` or ``"backward"``) that no later
    op of the phase, nor its final reads, nor (after the forward) the backward reads, so
    the runner drops them once op ``i`` has run."""
    memo = _SCHEDULES.setdefault(program, {})
    found = memo.get(("releases", phase))
    if found is None:
        found = memo[("releases", phase)] = _releases(program, phase)
    return found


def _releases(program: Any, phase: str):
    if phase == "forward":
        ops, tail = program.forward_ops, set(program.graph.outputs)
        keep = saved_for_backward(program) | tail
    elif phase == "backward":
        ops = program.backward_ops
        keep = {v for v in program.graph.grads if v is not None}
    else:
        raise RuntimeShellError(f"unknown phase {phase!r}", value=phase)
    last: dict = {}
    for i, op in enumerate(ops):
        for j in range(len(op.output_specs)):
            last.setdefault(_value(op.node, j), i)  # made and never read: drop at once
        for v in op.inputs:
            last[v] = i
    out: list[list] = [[] for _ in ops]
    for v, i in last.items():
        if v not in keep:
            out[i].append(v)
    return tuple(tuple(x) for x in out)


def _value(node: int, index: int):
    from meshplan.strategy.programs._graph import Value

    return Value(node, index)
