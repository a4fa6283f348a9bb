"""torch 2.13's DTensor running a program, as a peer: which collectives it issues.

Runs a function on DTensors of the same placements on a fake process group (one
process, no values exchanged: the collectives' kinds, groups and sizes are what
matter), moving each gradient to its parameter's placements at the end as a user must,
and records every functional collective that reaches the dispatcher. Each is priced
with meshplan's cost model as the one-step move it is (a gather of that many bytes over
that group's mesh dims, …), so both programs are priced by one model.
"""

from __future__ import annotations

import itertools
from typing import Any

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

from meshplan.placement import Partial, Replicate, Shard, Spec, to_torch
from meshplan.redistribute import CostModel, transition_cost


def ensure_fake_world(world: int) -> None:
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        if dist.get_world_size() == world:
            return
        dist.destroy_process_group()
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)


class _Record(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.log: list[tuple[str, int, str, tuple[int, ...]]] = []
        c10d = torch.ops._c10d_functional
        self.kinds = {
            c10d.all_gather_into_tensor.default: "all_gather",
            c10d.reduce_scatter_tensor.default: "reduce_scatter",
            c10d.all_reduce.default: "all_reduce",
            c10d.all_to_all_single.default: "all_to_all",
        }

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        from torch.distributed.tensor import DTensor

        if any(issubclass(t, DTensor) for t in types):
            return NotImplemented  # let DTensor desugar into collectives first
        kind = self.kinds.get(func)
        if kind is not None:
            from torch.distributed.distributed_c10d import _resolve_process_group

            t = args[0]
            ranks = tuple(dist.get_process_group_ranks(_resolve_process_group(args[-1])))
            dtype = str(t.dtype).removeprefix("torch.")
            self.log.append((kind, t.numel(), dtype, ranks))
        return func(*args, **(kwargs or {}))


def dtensor_collectives(fn, tensors, specs) -> list[tuple[str, int, str, tuple[int, ...]]]:
    """(kind, input elements, dtype, group ranks) of every collective DTensor issues."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import distribute_tensor

    mesh = specs[0].mesh
    ensure_fake_world(mesh.world_size)
    dm = init_device_mesh("cpu", mesh.shape)
    dts = []
    for t, s in zip(tensors, specs, strict=True):
        d = distribute_tensor(t, dm, to_torch(s))
        dts.append(d.detach().requires_grad_() if t.is_floating_point() else d)
    rec = _Record()
    with rec:
        loss = fn(*dts)
        loss.backward()
        for d, s in zip(dts, specs, strict=True):
            if d.grad is not None:
                d.grad.redistribute(dm, to_torch(s))  # the gradient in its parameter's layout
    return rec.log


def _dims_of(mesh, ranks: tuple[int, ...]) -> tuple[int, ...]:
    want = sorted(ranks)
    for k in range(1, mesh.ndim + 1):
        for dims in itertools.combinations(range(mesh.ndim), k):
            if sorted(mesh.group_of(ranks[0], dims)) == want:
                return dims
    raise ValueError(f"group {ranks} is no set of mesh dims of {mesh}")


def price(log, mesh, model: CostModel | None = None) -> dict[str, Any]:
    """meshplan's price of each recorded collective, summed: comm seconds, bytes, count."""
    model = model or CostModel.default()
    comm = nbytes = 0.0
    for kind, n, dtype, ranks in log:
        dims = _dims_of(mesh, ranks)
        k = len(ranks)

        def spec(placement, shape, on=dims, dtype=dtype):
            pl = [placement if m in on else Replicate() for m in range(mesh.ndim)]
            return Spec(mesh, pl, shape, dtype)

        if kind == "all_gather":
            src, dst = spec(Shard(0), (n * k,)), spec(Replicate(), (n * k,))
        elif kind == "reduce_scatter":
            src, dst = spec(Partial(), (n,)), spec(Shard(0), (n,))
        elif kind == "all_reduce":
            src, dst = spec(Partial(), (n,)), spec(Replicate(), (n,))
        else:
            src, dst = spec(Shard(1), (k, n)), spec(Shard(0), (k, n))
        c = transition_cost(src, dst, dims, kind, model)
        comm += c.comm
        nbytes += c.bytes
    return {"comm": comm, "bytes": nbytes, "collectives": len(log)}
