"""The table ``explain`` prints: per step its process groups, traffic, peak memory and cost."""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from meshplan.errors import PlanError
from meshplan.layout._mesh import first_instance
from meshplan.layout._ranks import short_repr
from meshplan.placement import Spec, dtype_itemsize, local_numel

from ._collectives import ASSEMBLING
from ._profile import CostModel
from ._step_cost import Cost, step_cost
from ._steps import Step, placement_change
from .exchange import transfers_to

__all__ = ["explain_steps", "StepReport", "step_report"]

_EXACT_LIMIT = 1024  # ranks: beyond this, peak memory is read off the first group only
_TRANSFER_LIMIT = 1 << 12  # ranks times group size: beyond this, traffic comes from the model


@attrs.frozen
class StepReport:
    """The facts ``explain`` prints for one step (max over ranks where per rank)."""

    group: str  # alias name or mesh dim names
    group_size: int
    example_group: Sequence[int]  # a tuple; on a large group its ranks computed on demand
    recv_bytes: int
    sent_bytes: int
    peak_bytes: int
    cost: Cost


def step_report(step: Step, model: CostModel | None = None) -> StepReport:
    """Groups, bytes sent/received and peak memory per rank, and the price of one step.

    >>> from meshplan.layout import Mesh
    >>> from meshplan.placement import Replicate, Shard, Spec
    >>> mesh = Mesh.create(2)
    >>> s = Step(0, Spec(mesh, [Shard(0)], (4,)), Spec(mesh, [Replicate()], (4,)), "all_gather")
    >>> r = step_report(s)
    >>> r.group, r.example_group, r.recv_bytes, r.peak_bytes
    ('d0', (0, 1), 8, 24)
    """
    if not isinstance(step, Step):
        raise PlanError(f"step_report needs a Step, got {step!r}", value=step)
    src, dst = step.src, step.dst
    mesh = src.mesh
    item = dtype_itemsize(src.dtype)
    # every count below is read off the mesh's shape: ranks are listed only on small meshes
    size = mesh.size()
    first = mesh.rank_at((0,) * mesh.ndim)
    group_size = 1
    for m in step.mesh_dims:
        group_size *= mesh.shape[m]
    group: Sequence[int]
    if group_size <= _EXACT_LIMIT:
        group = mesh.group_of(first, step.mesh_dims)
    else:
        group = _GroupRanks(mesh, first, tuple(step.mesh_dims), group_size)
    names = ",".join(mesh.names[m] for m in step.mesh_dims)
    label = f"{step.alias}=({names})" if step.alias else names
    price = step_cost(step, model)
    exact = size <= _EXACT_LIMIT
    # each rank receives from up to its whole group: count transfers while that stays small
    counted = size * group_size <= _TRANSFER_LIMIT
    ranks = first_instance(mesh) if exact or counted else ()
    # chunks never grow with the coordinate, so on a large mesh the rank at coordinate 0
    # holds the largest local tensor of both specs
    sample = ranks if exact else (first,)
    peak = max((local_numel(src, r) + local_numel(dst, r)) * item for r in sample)
    recv = sent = 0
    if step.collective in ASSEMBLING and counted:
        got: dict[int, int] = {}
        out: dict[int, int] = {}
        for r in ranks:
            for t in transfers_to(step, r):
                if t.sender != t.receiver:
                    got[r] = got.get(r, 0) + t.numel() * item
                    out[t.sender] = out.get(t.sender, 0) + t.numel() * item
        recv = max(got.values(), default=0)
        sent = max(out.values(), default=0)
    elif step.collective is not None:
        recv = sent = price.bytes
    return StepReport(label, group_size, group, recv, sent, peak, price)


class _GroupRanks(Sequence):
    """The ranks of a large group, computed on demand (position ``i``: row-major over the
    group's mesh dims, last fastest), so a report on a huge mesh never lists them."""

    def __init__(self, mesh, first: int, dims: tuple[int, ...], size: int) -> None:
        self._mesh, self._first, self._dims, self._size = mesh, first, dims, size

    def __len__(self) -> int:
        return self._size

    def __getitem__(self, i):
        if isinstance(i, slice):
            return tuple(self[j] for j in range(*i.indices(self._size)))
        if i < 0:
            i += self._size
        if not 0 <= i < self._size:
            raise IndexError(i)
        coord = [0] * self._mesh.ndim
        for m in reversed(self._dims):
            coord[m] = i % self._mesh.shape[m]
            i //= self._mesh.shape[m]
        return self._mesh.rank_at(coord, at=self._first)

    def __eq__(self, other) -> bool:
        if isinstance(other, _GroupRanks):
            return (self._mesh, self._first, self._dims) == (other._mesh, other._first, other._dims)
        return NotImplemented

    def __hash__(self) -> int:
        return hash((self._mesh, self._first, self._dims))

    def __repr__(self) -> str:
        return short_repr(self, limit=16)


def _fmt_bytes(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def _fmt_time(seconds: float) -> str:
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds * 1e6:.1f} us"


def explain_steps(
    src: Spec, dst: Spec, steps: Sequence[Step], model: CostModel | None = None
) -> str:
    """The table of the steps turning ``src`` into ``dst`` (a plan's): process groups, bytes
    per rank, peak local memory, cost (what ``explain(plan)`` prints).

    >>> from meshplan.layout import Mesh
    >>> from meshplan.placement import Replicate, Shard
    >>> mesh = Mesh.create((2, 4), ("dp", "tp"))
    >>> a = Spec(mesh, [Shard(0), Shard(1)], (8, 8))
    >>> b = Spec(mesh, [Replicate(), Shard(1)], (8, 8))
    >>> print(explain_steps(a, b, [Step("dp", a, b, "all_gather")]))
    Plan f32[8,8](S(0) S(1)) -> f32[8,8](R S(1)) on Mesh((2, 4), names=('dp', 'tp'))
     #  step        placements  group  size  example group  recv/rank  sent/rank  peak/rank  cost
     0  all_gather  S(0) -> R   dp     2     (0, 4)         32 B       32 B       96 B       9.0 us
    total: 1 step (1 collective), recv 32 B/rank, peak 96 B/rank, cost 9.0 us (comm 9.0 us, compute 0.0 us)
    """
    head = f"Plan {src} -> {dst} on {src.mesh}"
    if not steps:
        same = "the specs are equal" if src == dst else "every rank holds its target"
        return f"{head}: nothing to do ({same})"
    rows = [
        (
            "#",
            "step",
            "placements",
            "group",
            "size",
            "example group",
            "recv/rank",
            "sent/rank",
            "peak/rank",
            "cost",
        )
    ]
    total = Cost()
    recv = 0
    peak = 0
    for i, step in enumerate(steps):
        r = step_report(step, model)
        total = total + r.cost
        recv += r.recv_bytes
        peak = max(peak, r.peak_bytes)
        rows.append(
            (
                str(i),
                step.collective or "local",
                placement_change(step),
                r.group,
                str(r.group_size),
                short_repr(r.example_group, limit=16),
                _fmt_bytes(r.recv_bytes),
                _fmt_bytes(r.sent_bytes),
                _fmt_bytes(r.peak_bytes),
                _fmt_time(r.cost.total),
            )
        )
    widths = [max(len(row[k]) for row in rows) for k in range(len(rows[0]))]
    lines = [head]
    for row in rows:
        cells = [row[0].rjust(widths[0])] + [
            c.ljust(w) for c, w in zip(row[1:], widths[1:], strict=True)
        ]
        lines.append((" " + "  ".join(cells)).rstrip())
    n_coll = sum(step.collective is not None for step in steps)
    lines.append(
        f"total: {len(steps)} step{'s' if len(steps) != 1 else ''} "
        f"({n_coll} collective{'s' if n_coll != 1 else ''}), recv {_fmt_bytes(recv)}/rank, "
        f"peak {_fmt_bytes(peak)}/rank, cost {_fmt_time(total.total)} "
        f"(comm {_fmt_time(total.comm)}, compute {_fmt_time(total.compute)})"
    )
    return "\n".join(lines)
