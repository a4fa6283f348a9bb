"""The pure in-process simulator: run a plan on every rank's local tensor at once."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from meshplan.errors import PlanError
from meshplan.placement import local_shape
from meshplan.placement._tensor import reduction_dtype

from ._collectives import ASSEMBLING
from ._local_ops import apply_local, empty_target, finish_reduce, pack, unpack_into
from ._plan import Plan
from ._steps import Step, reduce_op
from .exchange import reduce_blocks, step_group, transfers_to

__all__ = ["simulate", "simulate_step"]


def simulate(plan: Plan | Step, locals_: Mapping[int, torch.Tensor]) -> dict[int, torch.Tensor]:
    """Every rank's local tensor after running ``plan`` (a dict rank -> tensor in and out).

    The reference semantics of every step kind; the runtime executes the same
    transfers with real collectives.

    >>> from meshplan.layout import Mesh
    >>> from meshplan.placement import Replicate, Shard, Spec, shard
    >>> mesh = Mesh.create(2)
    >>> a, b = Spec(mesh, [Shard(0)], (3,), "int64"), Spec(mesh, [Replicate()], (3,), "int64")
    >>> simulate(Step(0, a, b, "all_gather"), shard(torch.arange(3), a))
    {0: tensor([0, 1, 2]), 1: tensor([0, 1, 2])}
    """
    if not isinstance(plan, Plan | Step):
        raise PlanError(f"simulate runs a Plan or a Step, got {plan!r}", value=plan)
    steps = (plan,) if isinstance(plan, Step) else plan.steps
    _check_locals(plan.src, locals_)
    out = dict(locals_)
    for step in steps:
        out = simulate_step(step, out)
    return out


def _check_locals(spec, locals_: Mapping[int, torch.Tensor]) -> None:
    """Raise :class:`PlanError` unless ``locals_`` maps ranks of ``spec``'s mesh to local
    tensors of ``spec``'s shapes and dtype."""
    if not isinstance(locals_, Mapping) or not locals_:
        raise PlanError(
            f"simulate needs a dict rank -> local tensor of {spec}, got {locals_!r}",
            value=locals_,
        )
    for rank, local in locals_.items():
        if not isinstance(local, torch.Tensor):
            raise PlanError(f"rank {rank!r}'s local is {type(local)!r}, not a tensor", value=rank)
        if not spec.mesh.contains(rank):
            raise PlanError(f"rank {rank!r} is not in mesh {spec.mesh}", value=rank)
        want = local_shape(spec, rank)
        dtype = str(local.dtype).removeprefix("torch.")
        if tuple(local.shape) != want or dtype != spec.dtype:
            raise PlanError(
                f"rank {rank}'s local tensor is {dtype}{list(local.shape)}, but {spec} gives "
                f"it {spec.dtype}{list(want)}",
                value=rank,
            )


def _group(step: Step, rank: int, locals_: Mapping[int, torch.Tensor]):
    """The step's group of ``rank``, every member of which must have a local tensor."""
    group = step_group(step, rank)
    missing = [g for g in group.ranks if g not in locals_]
    if missing:
        raise PlanError(
            f"simulate needs rank {missing[0]}'s tensor (rank {rank} reduces with it)",
            value=missing[0],
        )
    return group


def simulate_step(step: Step, locals_: Mapping[int, torch.Tensor]) -> dict[int, torch.Tensor]:
    """One step on every rank (a dict rank -> tensor in and out, as :func:`simulate`)."""
    if not isinstance(step, Step):
        raise PlanError(
            f"simulate_step runs one Step, got {step!r}; run a Plan with simulate", value=step
        )
    _check_locals(step.src, locals_)
    kind = step.collective
    ranks = sorted(locals_)
    out: dict[int, torch.Tensor] = {}
    if kind is None:
        return {r: apply_local(step, r, locals_[r]) for r in ranks}
    if kind in ASSEMBLING:
        for r in ranks:
            target = empty_target(step, r, locals_[r])
            for t in transfers_to(step, r):
                if t.sender not in locals_:
                    raise PlanError(f"simulate needs rank {t.sender}'s tensor", value=t.sender)
                unpack_into(target, t.segments, pack(locals_[t.sender], t.segments))
            out[r] = target
        return out
    op = reduce_op(step)
    if kind == "all_reduce":
        done: dict[tuple[int, ...], torch.Tensor] = {}
        for r in ranks:
            group = _group(step, r, locals_).ranks
            if group not in done:
                done[group] = _reduced([locals_[g] for g in group], op, step)
            out[r] = done[group].clone()
        return out
    if kind == "reduce_scatter":
        for r in ranks:
            group = _group(step, r, locals_)
            parts = [pack(locals_[g], reduce_blocks(step, g)[group.position]) for g in group.ranks]
            reduced = _reduced(parts, op, step)
            target = empty_target(step, r, locals_[r])
            unpack_into(target, reduce_blocks(step, r)[group.position], reduced)
            out[r] = target
        return out
    raise PlanError(f"cannot simulate collective {kind!r}", value=step)


def _reduced(parts: list[torch.Tensor], op: str, step) -> torch.Tensor:
    """The reduction of ``parts`` with ``op``, divided by the step's ``avg_scale``, in
    :func:`~meshplan.placement._tensor.reduction_dtype` (then back to the parts' dtype)."""
    dtype = parts[0].dtype
    wide = reduction_dtype(dtype)
    if wide != dtype:
        return finish_reduce(_reduce([p.to(wide) for p in parts], op), step).to(dtype)
    return finish_reduce(_reduce(parts, op), step)


def _reduce(parts: list[torch.Tensor], op: str) -> torch.Tensor:
    stacked = torch.stack([p.contiguous() for p in parts])
    if op == "sum":
        return stacked.sum(0).to(parts[0].dtype)
    if op == "max":
        return stacked.amax(0)
    return stacked.amin(0)
