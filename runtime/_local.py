"""One op of a planned program on one rank's local tensors, as its ``LocalCall`` says.

Every rank runs a program's aten call on its local tensors: the call's arguments with
tensors put in, the rank's local shape where an argument holds the result's global
shape, a sharded ``arange``'s own range, and a random op's shard of one global draw from
the generator seeded for it. The process-group shell and the simulator both run ops
through :func:`run_local`, so they agree by construction.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from meshplan.errors import RuntimeShellError
from meshplan.placement import Spec, global_offset, local_shape
from meshplan.placement._tensor import shard_one
from meshplan.strategy import Program, ProgramOp, TensorArg
from meshplan.strategy.programs._graph import TorchConst
from meshplan.strategy.programs._local_call import Draw, LocalCall, draw_seeds
from meshplan.strategy.programs._trace import to_torch_const

__all__ = ["as_outputs", "checked_seeds", "run_local"]


def _decode(value: Any, tensors: Sequence[Any], device: Any) -> Any:
    if isinstance(value, TensorArg):
        return tensors[value.index]
    if isinstance(value, TorchConst):
        return to_torch_const(value, device)
    if isinstance(value, tuple):
        return [_decode(v, tensors, device) for v in value]
    return value


def run_local(
    op: ProgramOp, tensors: Sequence[torch.Tensor], rank: int, device: Any, seed: int | None = None
):
    """Rank ``rank``'s part of ``op`` from its local tensors (``seed``: the generator's of a
    random op), as its :class:`LocalCall` says."""
    call = op.local
    spec = op.output_specs[0] if op.output_specs else None
    if seed is not None:
        return _draw(call, spec, tensors, rank, device, seed)
    if call.contiguous:
        tensors = [t.contiguous() for t in tensors]
    args = [_decode(a, tensors, device) for a in call.args]
    kwargs = {k: _decode(v, tensors, device) for k, v in call.kwargs}
    if call.size is not None and spec is not None:
        shape = list(local_shape(spec, rank))
        local = shape if call.size.dim is None else shape[call.size.dim]
        if call.size.position < len(args):
            args[call.size.position] = local
    if call.view:
        return tensors[0].reshape(args[1])
    if call.range is not None and spec is not None:
        # a shard of a range is the range of its own indices
        start, end, step = call.range.of(global_offset(spec, rank)[0], local_shape(spec, rank)[0])
        return torch.ops.aten.arange.start_step(start, end, step, **kwargs)
    return _target_of(call)(*args, **kwargs)


def _draw(call: LocalCall, spec: Spec | None, tensors, rank: int, device: Any, seed: int) -> Any:
    """A random op's result on rank ``rank``: its shard of the one global draw from a
    generator seeded ``seed`` (see :mod:`meshplan.strategy.rules._random`). Every rank draws
    the whole global tensor and keeps its chunks: exact, at O(global numel) per op."""
    draw = call.draw
    gen = torch.Generator(device=device if device is not None else "cpu")
    gen.manual_seed(seed)
    dtype = getattr(torch, draw.dtype)
    args = [_decode(a, tensors, device) for a in call.args]
    kwargs = {k: _decode(v, tensors, device) for k, v in call.kwargs if k != "generator"}

    def mine(whole: torch.Tensor) -> torch.Tensor:
        return whole if spec is None else shard_one(whole, spec, rank)

    kind = draw.kind
    if kind is Draw.GENERATOR:  # no rule: it runs replicated, on whole tensors
        return _target_of(call)(*args, **kwargs, generator=gen)
    whole = torch.empty(draw.shape, dtype=dtype, device=device)
    if kind is Draw.SHAPED:  # the input gives only shape and dtype
        return mine(_target_of(call)(whole, *args[1:], **kwargs, generator=gen))
    if kind is Draw.UNIFORM:
        return mine(whole.uniform_(0, 1, generator=gen))
    if kind is Draw.NORMAL:
        return mine(whole.normal_(0, 1, generator=gen))
    if kind is Draw.INTEGERS:
        return mine(whole.random_(draw.low, draw.high, generator=gen))
    # elementwise: one uniform draw per element, compared with the local input there
    x = tensors[0]
    u = mine(torch.empty(draw.shape, dtype=x.dtype, device=device).uniform_(0, 1, generator=gen))
    if kind is Draw.BERNOULLI:
        p = x if len(tensors) == 1 else tensors[1]
        return (u < p).to(x.dtype)
    if not draw.train:  # native_dropout(input, p, train)
        return x.clone(), torch.ones_like(x, dtype=torch.bool)
    p = draw.p
    keep = u < 1 - p
    out = x * keep * (1.0 / (1 - p)) if p < 1 else torch.zeros_like(x)
    return out, keep


def _target_of(call: LocalCall):
    _, name, overload = call.target.split(".")
    return getattr(getattr(torch.ops.aten, name), overload)


def checked_seeds(program: Program, seed: int | None, step: int) -> dict[int, int]:
    """Each random op's generator seed, by node (see :mod:`meshplan.strategy.rules._random`)."""
    draws = program.draws
    if not draws:
        return {}
    if seed is None or isinstance(seed, bool) or not isinstance(seed, int):
        names = sorted({program.graph.nodes[n].call.target for n in draws})
        raise RuntimeShellError(
            f"the program draws random numbers ({', '.join(names)}), so it needs seed= (an "
            f"int, the same on every rank; got {seed!r}) and step= (the training step, so "
            "each step draws anew and a resumed run continues the stream)",
            value=seed,
        )
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise RuntimeShellError(f"step= must be an int >= 0, got {step!r}", value=step)
    return draw_seeds(program.graph, seed, step)  # a recomputed op redraws its original's


def as_outputs(result: Any, op: ProgramOp) -> tuple[Any, ...]:
    """An op's result as the tuple of its outputs."""
    return tuple(result) if isinstance(result, tuple | list) else (result,)
