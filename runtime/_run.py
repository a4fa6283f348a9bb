"""The shell: run plans on torch.distributed process groups, and a differentiable redistribute.

Each step runs with one collective on the step's group (a mesh dim, several, or a
flattened alias): ``all_gather`` and ``reduce_scatter`` as single-tensor collectives,
``all_reduce`` with sum/max/min (avg is a sum and a division), ``all_to_all`` as one
``all_to_all_single`` (gloo included), ``all_permute`` as one ``batch_isend_irecv``, and
local steps as slices and scales. What every rank sends and receives comes from the pure
:mod:`meshplan.redistribute.exchange` bookkeeping, the same the simulator uses, so a run
gives every rank exactly the simulator's local tensor; collectives speak in mesh
coordinates (:mod:`._collectives`), so permuted rank maps cannot permute data.

Uneven and empty shards are padded on the wire; outputs are new contiguous tensors.
Data-moving steps carry any dtype (one the backend lacks, such as int16 or float8 on
gloo, travels as a same-size dtype it has); reductions run in the tensor's dtype, or for
integer dtypes the backend lacks in int64 (exact, wrapping like the dtype), and for 8-bit
floats in float64 (exact, rounded once back), as in the simulator.
"""

from __future__ import annotations

import functools
import itertools
from typing import Any

import torch

from meshplan.errors import PlanError, RuntimeShellError
from meshplan.placement import Spec, local_shape
from meshplan.placement._tensor import reduction_dtype
from meshplan.redistribute import exchange as _exchange
from meshplan.redistribute._local_ops import (
    apply_local,
    finish_reduce,
    pack,
    traced_as_constant,
    unpack_into,
)
from meshplan.redistribute._plan import Plan
from meshplan.redistribute._steps import Step, reduce_op
from meshplan.redistribute.exchange import step_group

from . import _collectives as C
from . import _p2p
from ._agree import check_same_plan
from ._backend_model import runs_on_gloo
from ._failstop import fail_stop
from ._group import Group
from ._groups import ProcessGroups
from ._schedules import (
    _all_to_all_schedule,
    _gather_grid,
    _gather_schedule,
    _recv_shapes,
    _scatter_rows,
)

# the per-rank bookkeeping, kept as constants by torch.compile (see traced_as_constant)
transfers_from = traced_as_constant(_exchange.transfers_from)
transfers_to = traced_as_constant(_exchange.transfers_to)
reduce_blocks = traced_as_constant(_exchange.reduce_blocks)
_local_shape = traced_as_constant(local_shape)

__all__ = ["run", "run_step", "prepare_groups", "dtype_of"]

# dtypes every backend moves and reduces (gloo and NCCL both); others travel as a
# same-size stand-in through data-moving collectives
_NATIVE = {
    torch.float64,
    torch.float32,
    torch.float16,
    torch.bfloat16,
    torch.complex64,
    torch.complex128,
    torch.int64,
    torch.int32,
    torch.int8,
    torch.uint8,
    torch.bool,
}
_STAND_IN = {1: torch.uint8, 2: torch.float16, 4: torch.int32, 8: torch.int64, 16: torch.complex128}


# -- running plans ------------------------------------------------------------------------


def run(plan: Plan | Step, local: torch.Tensor, groups: ProcessGroups) -> torch.Tensor:
    """Run ``plan`` on the calling rank's ``local`` tensor; every rank of the mesh calls it.

    Returns the rank's local tensor for ``plan.dst``: a new contiguous tensor (the input
    is never modified or returned). Raises :class:`RuntimeShellError` when ``local``
    does not fit ``plan.src`` on this rank or a collective fails (a peer died, timed out
    or disagreed).

    Unless ``ProcessGroups(mesh, check_specs=False)``, every rank first checks, once per
    plan, that all ranks run the same plan (see :mod:`meshplan.runtime._agree`). The
    first run of a plan on ``groups`` also resolves its steps' groups and keeps them
    there, so a repeated run looks up only the plan itself.

    Every rank of a running world calls it (see ``tests/runtime``); it checks what it
    is given before any collective, so a wrong call fails on the spot:

    >>> run("S(0) -> R", None, None)
    Traceback (most recent call last):
    ...
    meshplan.errors.PlanError: run needs a Plan (meshplan.redistribute.plan(src, dst)) or a Step, got str 'S(0) -> R'
    """
    _check_plan(plan, "run")
    # an error on this rank alone would leave the others waiting for it: every error
    # past here stops the world (see _failstop), but the plan check's, raised by every
    # rank at once
    with fail_stop():
        _check_local(local, plan.src, groups)
    if groups.check_specs:  # the plan every rank runs (the lowest rank's, where theirs differ)
        plan = check_same_plan(plan, groups)
    with fail_stop():
        resolved = None if torch.compiler.is_compiling() else groups._runs.get(plan)
        if resolved is None:
            _prepare_every(groups)
    # the data, not its autograd history (``redistribute`` is the differentiable form): a
    # parameter's buffers may not be written in place under grad mode
    data = local.detach()
    out = data
    with fail_stop(), torch.no_grad():
        if resolved is None:
            resolved = _resolve(plan, groups)
        for step, group in resolved:
            out = _run_step(step, out, groups, group)
    if out is data:
        out = data.clone(memory_format=torch.contiguous_format)
    return out


_RESOLVED = 4096  # plans whose steps' groups a ProcessGroups keeps resolved, at most


def _resolve(plan: Plan | Step, groups: ProcessGroups) -> tuple[tuple[Step, Group | None], ...]:
    """The plan's steps with their groups (created here on first use, in step order),
    kept on ``groups`` so a repeated run looks up nothing but the plan."""
    steps = (plan,) if isinstance(plan, Step) else plan.steps
    resolved = tuple((s, None if s.collective is None else _group(s, groups)) for s in steps)
    if not torch.compiler.is_compiling():
        runs = groups._runs
        if len(runs) >= _RESOLVED:
            runs.clear()
        runs[plan] = resolved
    return resolved


def prepare_groups(plan: Plan | Step, groups: ProcessGroups) -> None:
    """Create the process groups ``plan`` needs, in the order its steps use them.

    Creating a group involves every rank of the world, so when a mesh covers only part
    of the world, the ranks outside it call this (with the same plans, in the same
    order) while the mesh's ranks run them. Calling it on the mesh's ranks too is
    harmless. For a mesh over the whole world ``run`` creates what it needs by itself.

    On a mesh over part of the world this creates, once, every group any plan on the
    mesh can use (each set of its mesh dims, so aliases too), and ``run`` and
    ``redistribute`` do the same on the mesh's ranks before they run: what a backward
    pass needs later (its transposed plan may use other groups, and a gradient of
    another dtype another plan) is then there on every rank, whatever ran where.

    >>> from meshplan.layout import Mesh
    >>> from meshplan.placement import Replicate, Shard, Spec
    >>> from meshplan.redistribute import plan as plan_
    >>> mesh = Mesh.create((2, 2), names=("dp", "tp"))
    >>> p = plan_(Spec(mesh, (Shard(0), Replicate()), (8, 8)), Spec(mesh, (Replicate(),) * 2, (8, 8)))
    >>> prepare_groups(p, mesh)
    Traceback (most recent call last):
    ...
    meshplan.errors.RuntimeShellError: prepare_groups needs the mesh's process groups, ProcessGroups(mesh), got Mesh ...
    """
    _check_plan(plan, "prepare_groups")
    _check_groups(groups, "prepare_groups")
    if _prepare_every(groups):
        return
    steps = (plan,) if isinstance(plan, Step) else plan.steps
    create = getattr(groups, "create", None) or groups.get
    for step in steps:
        if step.collective is not None:
            create(_group_key(step))


def _check_plan(plan: Any, what: str) -> None:
    if not isinstance(plan, Plan | Step):
        raise PlanError(
            f"{what} needs a Plan (meshplan.redistribute.plan(src, dst)) or a Step, got "
            f"{type(plan).__name__} {plan!r:.80}",
            value=plan,
        )


def _check_groups(groups: Any, what: str) -> None:
    if not isinstance(groups, ProcessGroups):
        raise RuntimeShellError(
            f"{what} needs the mesh's process groups, ProcessGroups(mesh), got "
            f"{type(groups).__name__} {groups!r:.80}",
            value=groups,
        )


def _prepare_every(groups) -> bool:
    """On a mesh over part of the world (groups created by every rank of it), create every
    group of every set of the mesh's dims, in one order; whether it did."""
    mesh = getattr(groups, "mesh", None)
    create = getattr(groups, "create", None)
    if mesh is None or create is None or getattr(groups, "local", False):
        return False
    import torch.distributed as dist

    if not dist.is_initialized() or mesh.size() >= dist.get_world_size():
        return False
    for key in _every_key(mesh):
        create(key)
    return True


@functools.lru_cache(maxsize=256)
def _every_key(mesh) -> tuple[tuple[int, ...], ...]:
    """Every set of the mesh's dims of size > 1 (by count, then in order): the groups of
    every step a plan on it can take (a merged step's alias is one of them)."""
    active = [m for m in range(mesh.ndim) if mesh.shape[m] > 1]
    return tuple(
        combo for k in range(1, len(active) + 1) for combo in itertools.combinations(active, k)
    )


def run_step(step: Step, local: torch.Tensor, groups: ProcessGroups) -> torch.Tensor:
    """Run one step on the calling rank (``local`` fits ``step.src``); returns a new tensor
    (of the data: no autograd history)."""
    if not isinstance(step, Step):
        raise PlanError(f"run_step runs a Step, got {type(step).__name__} {step!r:.80}", value=step)
    with fail_stop():
        _check_local(local, step.src, groups)
        with torch.no_grad():
            return _run_step(step, local.detach(), groups)


def _run_step(
    step: Step, local: torch.Tensor, groups: ProcessGroups, group: Group | None = None
) -> torch.Tensor:
    """One step; ``group``: the step's group when the caller resolved it already."""
    me = groups.rank
    kind = step.collective
    if kind is None:
        return apply_local(step, me, local)
    if group is None:
        group = _group(step, groups)
    local = local.contiguous()
    dtype = local.dtype
    if kind in ("all_gather", "all_to_all", "all_permute"):
        if dtype in _NATIVE:
            return _MOVES[kind](step, me, local, group)
        wire = _STAND_IN[local.element_size()]
        return _MOVES[kind](step, me, local.view(wire), group).view(dtype)
    op = reduce_op(step)
    if dtype not in _NATIVE:
        wide = reduction_dtype(dtype)  # 8-bit floats: float64, rounded back once
        if wide != dtype:
            return _REDUCES[kind](step, me, local.to(wide), group, op).to(dtype)
        if dtype.is_floating_point or dtype.is_complex:
            raise RuntimeShellError(
                f"step {step}: cannot reduce {dtype} tensors ({op}) with collectives; "
                "redistribute a copy in a wider dtype",
                value=dtype,
            )
        # wider on the wire, but wrapped to the dtype before an average divides, as the
        # backend does for the integers it carries (and the simulator for all)
        return _REDUCES[kind](step, me, local.to(torch.int64), group, op, dtype)
    return _REDUCES[kind](step, me, local, group, op)


def _group_key(step: Step):
    return step.alias if step.alias is not None else step.mesh_dims


@functools.lru_cache(maxsize=16384)
def _members(step: Step, rank: int) -> tuple[int, ...]:
    return step_group(step, rank).ranks


_members = traced_as_constant(_members)


def _group(step: Step, groups: ProcessGroups) -> Group:
    group = groups.get(_group_key(step))
    expect = _members(step, groups.rank)
    if group.ranks != expect:
        raise RuntimeShellError(
            f"step {step}: process group {group.name!r} holds ranks {group.ranks}, but the "
            f"step's mesh dims group rank {groups.rank} with {expect}; build ProcessGroups "
            "from the plan's mesh",
            value=step,
        )
    return group


def _check_local(local: torch.Tensor, spec: Spec, groups: ProcessGroups) -> None:
    _check_groups(groups, "run")
    rank = groups.rank
    if not isinstance(local, torch.Tensor):
        raise RuntimeShellError(
            f"run needs the rank's local torch.Tensor, got {type(local).__name__}", value=local
        )
    mesh = groups.mesh
    if spec.mesh is not mesh and not _same_ranks(spec.mesh, mesh):
        raise RuntimeShellError(
            f"the plan's mesh {spec.mesh} differs from the process groups' mesh {mesh}; "
            "build ProcessGroups from the plan's mesh",
            value=spec.mesh,
        )
    want = _shape_of(spec, rank)
    if want is None:
        raise RuntimeShellError(
            f"rank {rank} is not in mesh {spec.mesh} and holds no part of {spec}; run the "
            "plan on the mesh's ranks only (the others call prepare_groups)",
            value=rank,
        )
    if local.dtype != _torch_dtype(spec.dtype):
        raise RuntimeShellError(
            f"rank {rank}'s local tensor has dtype {dtype_of(local)}, but {spec} has dtype "
            f"{spec.dtype}; convert the tensor or plan for its dtype",
            value=local.dtype,
        )
    if local.shape != want:
        raise RuntimeShellError(
            f"rank {rank}'s local tensor has shape {tuple(local.shape)}, but {spec} gives it "
            f"{want}; pass the local shard of that spec",
            value=tuple(local.shape),
        )


@functools.lru_cache(maxsize=1024)
def _same_ranks(a, b) -> bool:
    """Whether two meshes put the same ranks at the same coordinates (aliases aside)."""
    return a.layout == b.layout and tuple(a.ranks) == tuple(b.ranks)


_same_ranks = traced_as_constant(_same_ranks)


@functools.lru_cache(maxsize=16384)
def _shape_of(spec: Spec, rank: int) -> tuple[int, ...] | None:
    """The rank's local shape, or None for a rank outside the mesh."""
    return local_shape(spec, rank) if spec.mesh.contains(rank) else None


_shape_of = traced_as_constant(_shape_of)


@functools.lru_cache(maxsize=64)
def _torch_dtype(name: str) -> torch.dtype:
    return getattr(torch, name)


def dtype_of(tensor: torch.Tensor) -> str:
    """The dtype name a :class:`Spec` uses for ``tensor`` ("float32", ...)."""
    return str(tensor.dtype).removeprefix("torch.")


def _from_grid(gathered: torch.Tensor, grid, target) -> torch.Tensor:
    """The target, a new contiguous tensor, from a gathered buffer tiling it as ``grid``
    (a reshape alone may return a strided view of the buffer)."""
    view, perm = grid
    return gathered.view(view).permute(perm).reshape(target).contiguous()


def _all_gather(step: Step, me: int, local: torch.Tensor, group: Group) -> torch.Tensor:
    plan = _gather_schedule(step, me)
    grid = _gather_grid(step, me, group._group_of_position)
    if grid is not None and group.size > 1:
        gathered = local.new_empty((group.size * local.shape[0], *local.shape[1:]))
        C.all_gather_into(gathered, local, group)
        return _from_grid(gathered, grid, plan.target)
    if plan.concat and group.is_identity and group.size > 1 and C.is_chunk_sizes(plan.sizes):
        # whole pieces, then a short one: the target is a prefix of the gathered buffer
        return C.all_gather_chunks(local.reshape(-1), group, plan.sizes).view(plan.target)
    if plan.concat and len(set(plan.sizes)) == 1:
        out = C.all_gather_concat(local, group)
        if tuple(out.shape) == plan.target:
            return out
        return out.reshape(plan.target)
    gathered = C.all_gather(local.reshape(-1), group, sizes=plan.sizes)
    if plan.concat:
        return torch.cat(gathered).view(plan.target)
    target = local.new_empty(plan.target)
    for pos, segs in plan.pieces:
        piece = gathered[pos].view(plan.shapes[pos])
        unpack_into(target, segs, pack(piece, segs))
    return target


def _all_to_all(step: Step, me: int, local: torch.Tensor, group: Group) -> torch.Tensor:
    plan = _all_to_all_schedule(step, me, group._group_of_position)
    send = local.new_empty((sum(plan.send_sizes),))
    for offset, numel, segs in plan.sends:
        piece = pack(local, segs)
        send[offset : offset + numel].view(piece.shape).copy_(piece)
    if plan.concat:
        target = local.new_empty(plan.target)
        C.all_to_all_flat(send, target.view(-1), plan.send_sizes, plan.recv_sizes, group)
        return target
    received = local.new_empty((sum(plan.recv_sizes),))
    C.all_to_all_flat(send, received, plan.send_sizes, plan.recv_sizes, group)
    target = local.new_empty(plan.target)
    for offset, numel, segs in plan.recvs:
        unpack_into(target, segs, received[offset : offset + numel])
    return target


def _all_permute(step: Step, me: int, local: torch.Tensor, group: Group) -> torch.Tensor:
    sends = [
        (t.receiver_pos, pack(local, t.segments).contiguous()) for t in transfers_from(step, me)
    ]
    incoming = transfers_to(step, me)
    recvs = list(_recv_shapes(step, me))
    received = _p2p.exchange(sends, recvs, group, dtype=local.dtype, device=local.device)
    target = local.new_empty(_local_shape(step.dst, me))
    for t, data in zip(incoming, received, strict=True):
        unpack_into(target, t.segments, data)
    return target


def _all_reduce(
    step: Step, me: int, local: torch.Tensor, group: Group, op: str, dtype=None
) -> torch.Tensor:
    """``dtype``: the tensor's own dtype when ``local`` travels wider (its sum is cast to
    it before an average divides)."""
    return finish_reduce(_as(C.all_reduce(local, group, op), dtype), step).contiguous()


def _as(tensor: torch.Tensor, dtype) -> torch.Tensor:
    return tensor if dtype is None else tensor.to(dtype)


def _reduce_scatter(
    step: Step, me: int, local: torch.Tensor, group: Group, op: str, dtype=None
) -> torch.Tensor:
    if group.size > 1 and _on_gloo(group.pg, local.device.type):
        return _reduce_scatter_by_all_reduce(step, me, local, group, op, dtype)
    rows = _scatter_rows(step, me)
    if rows is not None and len(set(rows)) == 1 and rows[0] > 0:
        return finish_reduce(_as(C.reduce_scatter(local, group, op), dtype), step).contiguous()
    mine = reduce_blocks(step, me)
    blocks = [pack(local, segs).contiguous() for segs in mine]
    reduced = _as(C.reduce_scatter(blocks, group, op), dtype)
    target = reduced.new_empty(_local_shape(step.dst, me))
    unpack_into(target, mine[group.position], finish_reduce(reduced, step))
    return target


def _reduce_scatter_by_all_reduce(
    step: Step, me: int, local: torch.Tensor, group: Group, op: str, dtype=None
) -> torch.Tensor:
    """A reduce_scatter as gloo runs it fastest: an all_reduce of the whole input, of
    which the rank keeps its position's block (gloo's own reduce_scatter reduces the
    whole input too, then copies more: measured slower at every size, 4 KiB to 4 MiB,
    on groups of 2 and 4 ranks)."""
    reduced = _as(C.all_reduce(local, group, op), dtype)
    rows = _scatter_rows(step, me)
    if rows is not None and len(set(rows)) == 1 and rows[0] > 0:
        mine = reduced.narrow(0, group.position * rows[0], rows[0])
        return finish_reduce(mine, step).contiguous()
    block = reduce_blocks(step, me)[group.position]
    target = reduced.new_empty(_local_shape(step.dst, me))
    unpack_into(target, block, finish_reduce(pack(reduced, block), step))
    return target


@functools.lru_cache(maxsize=256)
def _on_gloo(pg: Any, device_type: str) -> bool:
    """Whether collectives of ``device_type`` tensors on process group ``pg`` run on gloo."""
    import torch.distributed as dist

    if pg is None:
        return False
    return runs_on_gloo(str(dist.get_backend(pg)), device_type)


_MOVES = {"all_gather": _all_gather, "all_to_all": _all_to_all, "all_permute": _all_permute}
_REDUCES = {"all_reduce": _all_reduce, "reduce_scatter": _reduce_scatter}
