"""Tensor-side helpers shared by the simulator and the runtime: pack, unpack, local steps."""

from __future__ import annotations

import functools

import torch

from meshplan.placement import local_shape

from . import exchange as _exchange
from ._steps import Step
from .exchange import Segments

__all__ = [
    "pack",
    "unpack_into",
    "apply_local",
    "neutral_value",
    "empty_target",
    "finish_reduce",
    "traced_as_constant",
]


def traced_as_constant(lookup):
    """``lookup`` (a pure function of frozen values), which ``torch.compile`` calls while
    tracing and keeps the result of, instead of tracing through it.

    Dynamo cannot build frozen attrs values inside a graph (each one would break it) and
    tracing the bookkeeping is slow; the arguments are guarded by identity, so the kept
    result stays right. Outside tracing it is a plain call.

    >>> traced_as_constant(len)((1, 2))
    2
    """

    def constant(*args):
        return lookup(*args)

    constant.__name__ = getattr(lookup, "__name__", "lookup")
    return torch._dynamo.assume_constant_result(constant)


# cached: a local step asks the same of its (frozen) step or spec and rank on every run
_cached = functools.lru_cache(maxsize=16384)
local_shape = traced_as_constant(_cached(local_shape))
local_transform = traced_as_constant(_cached(_exchange.local_transform))
partial_actions = traced_as_constant(_cached(_exchange.partial_actions))
target_partial_op = traced_as_constant(_exchange.target_partial_op)


def _index(segs: Segments, which: int, device) -> torch.Tensor:
    if not segs:  # nothing overlaps along this dim (an empty shard)
        return torch.empty(0, dtype=torch.long, device=device)
    return torch.cat([torch.arange(s[which], s[which] + s[2], device=device) for s in segs])


def pack(tensor: torch.Tensor, segments: tuple[Segments, ...]) -> torch.Tensor:
    """The sender's side of a transfer: the product of segments, by source position."""
    out = tensor
    for d, segs in enumerate(segments):
        if len(segs) == 1:
            start, _, n = segs[0]
            if start != 0 or n != out.shape[d]:
                out = out.narrow(d, start, n)
        else:
            out = out.index_select(d, _index(segs, 0, tensor.device))
    return out


def unpack_into(target: torch.Tensor, segments: tuple[Segments, ...], data: torch.Tensor) -> None:
    """The receiver's side of a transfer: write ``data`` at the segments' target positions."""
    if data.numel() == 0:
        return
    if all(len(segs) == 1 for segs in segments):
        view = target
        for d, segs in enumerate(segments):
            _, start, n = segs[0]
            view = view.narrow(d, start, n)
        view.copy_(data.reshape(view.shape))
        return
    nd = len(segments)
    idx = []
    for d, segs in enumerate(segments):
        shape = [1] * nd
        shape[d] = -1
        idx.append(_index(segs, 1, target.device).view(shape))
    target[tuple(idx)] = data.reshape([sum(n for _, _, n in s) for s in segments])


def neutral_value(op: str | None, dtype: torch.dtype):
    """The element a Partial op ignores: 0 for sum/avg, the lowest value for max, highest for min."""
    if op in (None, "sum", "avg"):
        return 0
    if dtype.is_floating_point:
        return float("-inf") if op == "max" else float("inf")
    if dtype == torch.bool:
        return op == "min"
    info = torch.iinfo(dtype)
    return info.min if op == "max" else info.max


def empty_target(step: Step, rank: int, like: torch.Tensor) -> torch.Tensor:
    return torch.empty(local_shape(step.dst, rank), dtype=like.dtype, device=like.device)


def apply_local(step: Step, rank: int, local: torch.Tensor) -> torch.Tensor:
    """Run a local step (slice, Replicate/Shard -> Partial, sum <-> avg, or a shard
    placement said another way) on one rank."""
    segments = local_transform(step, rank)
    action, factor = partial_actions(step, rank)
    op = target_partial_op(step.dst)
    shape = local_shape(step.dst, rank)
    if action == "neutral":
        return torch.full(
            shape, neutral_value(op, local.dtype), dtype=local.dtype, device=local.device
        )
    if all(s is None for s in segments):
        out = local.clone()
    else:
        covered = all(
            s is None or (len(s) == 1 and s[0][1] == 0 and s[0][2] == shape[d])
            for d, s in enumerate(segments)
        )
        if covered:
            out = (
                pack(
                    local,
                    tuple(
                        s if s is not None else ((0, 0, local.shape[d]),)
                        for d, s in enumerate(segments)
                    ),
                )
                .contiguous()
                .clone()
            )
        else:
            out = torch.full(
                shape, neutral_value(op, local.dtype), dtype=local.dtype, device=local.device
            )
            full = tuple(
                s if s is not None else ((0, 0, local.shape[d]),) for d, s in enumerate(segments)
            )
            unpack_into(out, full, pack(local, full))
    if factor != 1:
        if out.is_floating_point() or out.is_complex():
            out = out * factor
        elif factor > 1:
            out = out * int(round(factor))
        else:
            out = out // int(round(1 / factor))
    return out.contiguous()


def finish_reduce(tensor: torch.Tensor, step: Step) -> torch.Tensor:
    """Divide a sum-reduction by the step's ``avg_scale`` (sum+avg merges)."""
    if step.avg_scale == 1:
        return tensor
    if tensor.is_floating_point() or tensor.is_complex():
        return tensor / step.avg_scale
    return tensor // step.avg_scale
