"""Bucketed, asynchronous collectives: a :class:`~._overlap.Launch` on process groups.

:func:`start` packs every move of a launch into one flat buffer and starts one
collective on it with ``async_op=True``; :meth:`Started.wait` waits for it (where the
first result is read) and unpacks each move's local result. What each rank packs and
where each received piece lands come from the same per-rank bookkeeping that
:func:`~meshplan.runtime.run` uses for a single step, so a bucketed move gives exactly
``run``'s result:

* all_reduce: one all_reduce of a buffer interleaving the moves' tensors segment by
  segment, so that each element is summed in the order it would be alone (gloo's ring
  sums a buffer's ``2 * n`` segments each in its own order; see :func:`_interleaved`).
* reduce_scatter: each move's wire as ``run`` builds it (its blocks per destination in
  torch group order, zero-padded to one width); gloo reduce-scatters a wire as an
  all_reduce of all of it, so the wires reduce as one interleaved all_reduce and each
  rank keeps its row of each (on other backends, one reduce_scatter of the wires side
  by side).
* all_gather: every rank sends its moves' tensors end to end (padded to one width); the
  gathered piece of each position is split per move and placed as ``run`` places it.

A move alone in its launch runs the very collective ``run`` would. So a bucketed run's
results equal an unbucketed run's bit for bit on gloo (on NCCL, which picks its own
reduction order per buffer size, up to rounding).
Results are new tensors (views into the bucket's received buffer); inputs are never
written.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from . import _run as R
from ._collectives import _TORCH_OPS, guard
from ._failstop import check, wait
from ._overlap import Launch

__all__ = ["Started", "start"]


class Started:
    """A launched bucket: its pending collective and how to unpack each move's result."""

    __slots__ = ("_work", "_finish", "_what", "_group", "_results", "_cuda")

    def __init__(self, work: Any, finish: Any, what: str, group: Any) -> None:
        self._work, self._finish, self._what, self._group = work, finish, what, group
        self._results: list[torch.Tensor] | None = None
        self._cuda = False  # set by start: how to wait (see _failstop.wait)

    def wait(self) -> list[torch.Tensor]:
        """Each move's local result, in the launch's order (waits once, the first time)."""
        if self._results is None:
            if self._work is not None:
                work, self._work = self._work, None
                if torch.compiler.is_compiling():
                    with guard(self._what, self._group):
                        work.wait()
                else:
                    wait(work, self._group, self._what, cuda=self._cuda)
            with torch.no_grad():
                self._results = self._finish()
            self._finish = None
        return self._results


def start(launch: Launch, tensors: Sequence[torch.Tensor], groups: Any) -> Started:
    """Start ``launch`` on this rank's ``tensors`` (one per move, each in its plan's source
    layout); every rank of the mesh starts the same launches in the same order."""
    steps = [plan.steps[0] for _, plan in launch.moves]
    group = R._group(steps[0], groups)
    me = groups.rank
    with torch.no_grad():
        tensors = [t.detach().contiguous() for t in tensors]
        if launch.kind == "all_reduce":
            started = _all_reduce(steps, tensors, group, launch.op)
        elif launch.kind == "reduce_scatter":
            started = _reduce_scatter(steps, tensors, group, launch.op, me)
        else:
            started = _all_gather(steps, tensors, group, me)
    started._cuda = any(t.is_cuda for t in tensors)
    return started


def _issue(call, what: str, group: Any, *args, **kwargs) -> Any:
    if group.size == 1:
        return None
    if not torch.compiler.is_compiling():
        check(what, group)
    with guard(what, group):
        return call(*args, group=group.pg, async_op=True, **kwargs)


def _all_reduce(steps, tensors, group, op: str) -> Started:
    flats = [t.reshape(-1) for t in tensors]
    what = f"all_reduce({op})"
    if len(flats) == 1:  # alone: as run() reduces it
        buffer = flats[0].clone()
        work = (
            _issue(dist.all_reduce, what, group, buffer, op=_TORCH_OPS[op])
            if buffer.numel()
            else None
        )

        def finish() -> list[torch.Tensor]:
            return [R.finish_reduce(buffer.view(tensors[0].shape), steps[0])]

        return Started(work, finish, what, group)
    buffer, take = _interleaved(flats, group.size)
    work = None
    if buffer.numel():
        work = _issue(dist.all_reduce, what, group, buffer, op=_TORCH_OPS[op])

    def finish() -> list[torch.Tensor]:
        return [
            R.finish_reduce(take(buffer, i).view(t.shape), s)
            for i, (t, s) in enumerate(zip(tensors, steps, strict=True))
        ]

    return Started(work, finish, what, group)


def _interleaved(flats: list[torch.Tensor], n: int):
    """One buffer reducing every flat tensor as its own all_reduce would, bit for bit, and
    a function taking tensor ``i``'s reduced elements back out of it.

    gloo's ring splits a buffer into ``2 * n`` equal segments (while a segment stays
    under its 1 MiB cap) and sums each segment's elements in an order set by the
    segment's index. So the buffer holds, as its segment ``s``, segment ``s`` of every
    tensor (zero-padded to that tensor's segment length): each element keeps the
    segment index, and so the summation order, it has alone.
    """
    parts = 2 * n
    lengths = [f.numel() for f in flats]
    segs = [-(-length // parts) for length in lengths]
    starts = [sum(segs[:i]) for i in range(len(segs))]
    buffer = flats[0].new_zeros((parts, sum(segs)))
    for f, seg, at in zip(flats, segs, starts, strict=True):
        if seg:
            full = f.numel() // seg
            buffer[:full, at : at + seg] = f[: full * seg].view(full, seg)
            rest = f.numel() - full * seg
            if rest:
                buffer[full, at : at + rest] = f[full * seg :]

    def take(reduced: torch.Tensor, i: int) -> torch.Tensor:
        return reduced[:, starts[i] : starts[i] + segs[i]].reshape(-1)[: lengths[i]]

    return buffer, take


def _reduce_scatter(steps, tensors, group, op: str, me: int) -> Started:
    """Each move's wire as run() builds it (per position, its block, zero-padded to one
    width, rows in torch group order); gloo reduce-scatters a wire as an all_reduce of the
    whole of it, keeping the caller's row, so several wires reduce as one interleaved
    all_reduce, bit for bit."""
    n = group.size
    blocks = [R.reduce_blocks(s, me) for s in steps]
    if n > 1 and _reduce_scatters_by_all_reduce(group):
        return _reduce_scatter_by_all_reduce(steps, tensors, group, op, me, blocks)
    wires = []
    for t, segs in zip(tensors, blocks, strict=True):
        packed = [R.pack(t, segs[p]).reshape(-1) for p in range(n)]
        width = max(b.numel() for b in packed)
        uneven = any(b.numel() != width for b in packed)
        wire = (t.new_zeros if uneven else t.new_empty)((n, width))
        for p, b in enumerate(packed):
            wire[group.group_rank(p), : b.numel()] = b
        wires.append(wire)
    what = f"reduce_scatter({op})"
    row = group.group_rank(group.position)
    if len(wires) == 1:  # alone: as run() reduce-scatters it
        wire = wires[0]
        out = wire[row].clone() if n == 1 else wire.new_empty((wire.shape[1],))
        work = None
        if wire.numel() and n > 1:
            work = _issue(
                dist.reduce_scatter_single, what, group, out, wire.view(-1), op=_TORCH_OPS[op]
            )
        mine = [out]
    elif _reduce_scatters_by_all_reduce(group):
        buffer, take = _interleaved([w.view(-1) for w in wires], n)
        work = None
        if buffer.numel():
            work = _issue(dist.all_reduce, what, group, buffer, op=_TORCH_OPS[op])
        mine = None
    else:  # a backend with a true reduce_scatter: the wires side by side, row by row
        widths = [w.shape[1] for w in wires]
        side = torch.cat(wires, dim=1)
        out = side.new_empty((side.shape[1],))
        work = None
        if side.numel():
            work = _issue(
                dist.reduce_scatter_single, what, group, out, side.view(-1), op=_TORCH_OPS[op]
            )
        mine = list(out.split(widths))

    def finish() -> list[torch.Tensor]:
        rows = mine or [take(buffer, i).view(w.shape)[row] for i, w in enumerate(wires)]
        results = []
        for reduced, s, segs in zip(rows, steps, blocks, strict=True):
            own = segs[group.position]
            target = reduced.new_empty(R._local_shape(s.dst, me))
            data = reduced[: _numel(own)]
            R.unpack_into(target, own, R.finish_reduce(data, s))
            results.append(target)
        return results

    return Started(work, finish, what, group)


def _reduce_scatter_by_all_reduce(steps, tensors, group, op: str, me: int, blocks) -> Started:
    """On gloo, as run() reduce-scatters there: an all_reduce of each whole input, of
    which the rank keeps its block; several inputs as one interleaved all_reduce, each
    element summed in the order it is alone."""
    flats = [t.contiguous().view(-1) for t in tensors]
    what = f"reduce_scatter({op})"
    if len(flats) == 1:
        buffer, take = flats[0].clone(), (lambda reduced, i: reduced)
    else:
        buffer, take = _interleaved(flats, group.size)
    work = None
    if buffer.numel():
        work = _issue(dist.all_reduce, what, group, buffer, op=_TORCH_OPS[op])

    def finish() -> list[torch.Tensor]:
        results = []
        for i, (t, s, segs) in enumerate(zip(tensors, steps, blocks, strict=True)):
            reduced = take(buffer, i).view(t.shape)
            own = segs[group.position]
            target = reduced.new_empty(R._local_shape(s.dst, me))
            R.unpack_into(target, own, R.finish_reduce(R.pack(reduced, own), s))
            results.append(target)
        return results

    return Started(work, finish, what, group)


def _reduce_scatters_by_all_reduce(group: Any) -> bool:
    """Whether the group's backend reduce-scatters as an all_reduce of the whole input
    (gloo does): then a bucket reduces as one interleaved all_reduce, in each element's own
    order and at the same cost; other backends (NCCL) reduce-scatter the wires side by
    side, at half the traffic, in an order of their own."""
    return group.pg is None or str(dist.get_backend(group.pg)) == "gloo"


def _numel(segments) -> int:
    """Elements a block of per-dim segments holds."""
    n = 1
    for segs in segments:
        n *= sum(k for _, _, k in segs)
    return n


def _all_gather(steps, tensors, group, me: int) -> Started:
    n = group.size
    plans = [R._gather_schedule(s, me) for s in steps]
    sizes = [sum(p.sizes[pos] for p in plans) for pos in range(n)]
    width = max(sizes)
    send = tensors[0].new_empty((width,))
    if tensors:
        torch.cat([t.reshape(-1) for t in tensors], out=send[: sizes[group.position]])
    out = send if n == 1 else send.new_empty((n * width,))
    work = _issue(dist.all_gather_single, "all_gather", group, out, send) if width else None

    def finish() -> list[torch.Tensor]:
        # each position's piece of the buffer, split per move
        parts = []
        for pos in range(n):
            at = group.group_rank(pos) * width
            parts.append(out[at : at + sizes[pos]].split([p.sizes[pos] for p in plans]))
        results = []
        for i, (t, plan) in enumerate(zip(tensors, plans, strict=True)):
            target = t.new_empty(plan.target)
            for sender, segs in plan.pieces:
                piece = parts[sender][i].view(plan.shapes[sender])
                R.unpack_into(target, segs, R.pack(piece, segs))
            results.append(target)
        return results

    return Started(work, finish, "all_gather", group)
