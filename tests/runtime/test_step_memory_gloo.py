"""The whole step's modeled peak per rank against what run_program holds on gloo.

Each rank runs the planned step under a dispatch mode that samples the process's live
heap bytes (glibc's ``mallinfo2``: bytes in use, mmapped chunks included) after every
aten call, collectives' buffers included; the peak above the bytes in use before the step,
plus the parameters' own bytes, is the measured peak. The tensors are megabytes, so the
interpreter's own allocations are noise. The model (``program.memory.peak``, see
``meshplan.strategy.programs._memory``) must be within 10% of it, and its separable lower estimate
(state and saved activations) must not exceed it.
"""

from __future__ import annotations

import ctypes
import os
import sys

import pytest
import torch
import torch.distributed as dist
from _shell_cases import groups_for

from meshplan.layout import Mesh
from meshplan.placement import Replicate, Shard, Spec, shard
from meshplan.runtime import run_program
from meshplan.strategy import plan_program

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="live heap bytes read from glibc's mallinfo2"
)


class _Mallinfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            [
                "arena",
                "ordblks",
                "smblks",
                "hblks",
                "hblkhd",
                "usmblks",
                "fsmblks",
                "uordblks",
                "fordblks",
                "keepcost",
            ]
        )
    ]


def _in_use() -> int:
    info = ctypes.CDLL("libc.so.6").mallinfo2
    info.restype = _Mallinfo2
    m = info()
    return int(m.uordblks + m.hblkhd)


def _measure(program, locals_):
    """(measured peak bytes, the loss) of one step of ``program`` on this rank."""
    from torch.utils._python_dispatch import TorchDispatchMode

    rank = dist.get_rank()
    groups = groups_for(program.arg_specs[0].mesh)
    xs = [
        loc[rank].clone().requires_grad_(g is not None)
        for loc, g in zip(locals_, program.grad_specs, strict=True)
    ]
    run_program(program, groups, *xs).backward()  # warm: groups, caches, buffers
    for x in xs:
        x.grad = None
    state = sum(x.numel() * x.element_size() for x in xs)
    peak = [0]

    class Sample(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            peak[0] = max(peak[0], _in_use())
            return out

    base = _in_use()
    with Sample():
        loss = run_program(program, groups, *xs)
        loss.backward()
    peak[0] = max(peak[0], _in_use())
    return peak[0] - base + state, float(loss)


def _mlp(x, *ws):
    for w in ws:
        x = torch.tanh(x @ w)
    return x.square().mean()


def _residual(x, *ws):
    for i in range(0, len(ws), 2):
        x = x + torch.tanh(x @ ws[i]) @ ws[i + 1]
    return x.square().mean()


@pytest.mark.parametrize("layout", ["dp", "tp", "chosen", "recompute"])
def test_the_modeled_peak_is_within_ten_percent_of_the_measured_one(pool4, layout):
    mesh = Mesh.create((4,), ("dp",))
    n, d, layers = {"chosen": (1024, 256, 6), "recompute": (4096, 128, 16)}.get(
        layout, (4096, 128, 10)
    )
    x = Spec(mesh, [Shard(0)], (n, d), "float64")
    grad = [False] + [True] * layers
    if layout == "tp":  # the weights sharded: gathers, moved copies and partial gradients
        ws = [Spec(mesh, [Shard(1)], (d, d), "float64")] * layers
    else:  # the batch sharded, the weights whole: activations sharded
        ws = [Spec(mesh, [Replicate()], (d, d), "float64")] * layers
    program = plan_program(_mlp, x, *ws, requires_grad=grad, state_bytes_per_param=0)
    if layout == "chosen":  # the planner picks the weights' layouts under a whole-step budget
        budget = program.memory.peak * 0.9
        program = plan_program(
            _mlp,
            x,
            *ws,
            requires_grad=grad,
            state_bytes_per_param=0,
            choose=range(1, layers + 1),
            memory_budget=budget,
        )
        assert program.memory.peak <= budget
    if layout == "recompute":  # residual layers, a budget only recompute meets
        always = plan_program(
            _residual, x, *ws, requires_grad=grad, state_bytes_per_param=0, recompute="always"
        )
        budget = always.memory.peak * 1.02
        program = plan_program(
            _residual, x, *ws, requires_grad=grad, state_bytes_per_param=0, memory_budget=budget
        )
        assert program.recomputed and program.memory.peak <= budget
    torch.manual_seed(0)
    tensors = [torch.randn(n, d, dtype=torch.float64)]
    tensors += [torch.randn(d, d, dtype=torch.float64) / d**0.5 for _ in ws]
    locals_ = [shard(t, s) for t, s in zip(tensors, program.arg_specs, strict=True)]
    measured = pool4.run(_measure, program, locals_)
    memory = program.memory
    if layout == "recompute":  # the recomputing step's loss is one process's
        want = float(_residual(*tensors))
        assert all(abs(loss - want) <= 1e-12 * abs(want) for _, loss in measured)
    for rank, (peak, _) in enumerate(measured):
        assert abs(memory.peak - peak) <= 0.10 * peak, (rank, memory, peak, os.getpid())
        # the separable estimate the solver bounds never exceeds what is held
        assert memory.total + memory.inputs + memory.activations <= peak * 1.02, (rank, memory)
