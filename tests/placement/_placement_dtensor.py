"""Run torch 2.13 DTensor on a meshplan spec in one process (fake group + LocalTensorMode).

Used by the conformance tests: what ``distribute_tensor`` puts on every rank, and what
``compute_local_shape_and_global_offset`` says about it, for a spec converted to torch
placements. Shard orders are given to torch the way torch 2.13 itself encodes them
(``DTensorSpec._convert_shard_order_to_StridedShard``), so its own encoding is tested,
not meshplan's.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import attrs
import torch
from _torch_oracle import ensure_fake_world, torch_mesh
from torch.distributed._local_tensor import LocalTensor, LocalTensorMode
from torch.distributed.tensor import Partial as TPartial
from torch.distributed.tensor import Replicate as TReplicate
from torch.distributed.tensor import Shard as TShard
from torch.distributed.tensor import distribute_tensor
from torch.distributed.tensor._dtensor_spec import DTensorSpec, ShardOrderEntry, TensorMeta
from torch.distributed.tensor._redistribute import redistribute_local_tensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
from torch.distributed.tensor.placement_types import _StridedShard

from meshplan.placement import Partial, Replicate, Shard, Spec, StridedShard

__all__ = ["TorchRun", "torch_placements", "run_distribute", "gather_with_shard_order"]


def _plain(p) -> Any:
    """meshplan placement -> torch placement, written out here (independent of to_torch)."""
    match p:
        case StridedShard(dim=d, split_factor=sf):
            return _StridedShard(d, split_factor=sf)
        case Shard(dim=d):
            return TShard(d)
        case Replicate():
            return TReplicate()
        case Partial(op=op):
            return TPartial(op)
    raise TypeError(p)


def torch_placements(spec: Spec, dm: Any) -> tuple[Any, ...]:
    """torch placements for ``spec``; a non-default shard order is encoded by torch itself."""
    plain = tuple(_plain(p) for p in spec.placements)
    if all(list(o) == sorted(o) for o in spec.shard_order.values()):
        return plain
    order = tuple(
        ShardOrderEntry(d, tuple(ms))
        for d, ms in sorted(spec.shard_order.items())
        if list(ms) != sorted(ms)
    )
    return DTensorSpec._convert_shard_order_to_StridedShard(order, plain, dm)


def _at(value: Any, rank: int) -> int:
    if isinstance(value, torch.SymInt):
        node = value.node
        if hasattr(node, "_local_ints"):
            return node._local_ints[rank]
        return int(node.maybe_as_int())
    return int(value)


@attrs.frozen
class TorchRun:
    placements: tuple[Any, ...]
    locals: dict[int, torch.Tensor]
    shapes: dict[int, tuple[int, ...]]
    offsets: dict[int, tuple[int, ...]]


def run_distribute(spec: Spec, x: torch.Tensor, *, src_data_rank: int | None = 0) -> TorchRun:
    """``distribute_tensor`` and ``compute_local_shape_and_global_offset`` on every rank."""
    mesh = spec.mesh
    ranks = list(mesh.ranks)
    ensure_fake_world(max(ranks) + 1)
    with LocalTensorMode(frozenset(ranks)):
        dm = torch_mesh(mesh.shape, mesh.names, ranks)
        placements = torch_placements(spec, dm)
        d = distribute_tensor(x, dm, placements, src_data_rank=src_data_rank)
        shape, offset = compute_local_shape_and_global_offset(tuple(x.shape), dm, placements)
        local = d._local_tensor
        per_rank = (
            dict(local._local_tensors)
            if isinstance(local, LocalTensor)
            else dict.fromkeys(ranks, local)
        )
        return TorchRun(
            placements,
            {r: per_rank[r].clone() for r in ranks},
            {r: tuple(_at(v, r) for v in shape) for r in ranks},
            {r: tuple(_at(v, r) for v in offset) for r in ranks},
        )


def gather_with_shard_order(spec: Spec, locals_: dict[int, torch.Tensor]) -> torch.Tensor:
    """torch's reading of an explicit shard order: redistribute ``locals_`` to Replicate.

    The local tensors are declared as ``DTensorSpec(placements, shard_order=...)``
    (torch's explicit representation) and torch's own redistribute gathers them.
    """
    mesh = spec.mesh
    ranks = list(mesh.ranks)
    x0 = locals_[ranks[0]]
    ensure_fake_world(max(ranks) + 1)
    with LocalTensorMode(frozenset(ranks)):
        dm = torch_mesh(mesh.shape, mesh.names, ranks)
        plain = tuple(_plain(p) for p in spec.placements)
        order = tuple(ShardOrderEntry(d, tuple(ms)) for d, ms in sorted(spec.shard_order.items()))
        stride = tuple(math.prod(spec.shape[i + 1 :]) for i in range(spec.ndim))
        meta = TensorMeta(torch.Size(spec.shape), stride, x0.dtype)
        src = DTensorSpec(dm, plain, meta, shard_order=order)
        dst = DTensorSpec(dm, (TReplicate(),) * mesh.ndim, meta)
        local = LocalTensor({r: locals_[r] for r in ranks})
        log = logging.getLogger("torch.distributed.tensor._redistribute")
        level = log.level
        log.setLevel(logging.ERROR)  # torch advises flattening the mesh: not our concern here
        try:
            out = redistribute_local_tensor(local, src, dst)
        finally:
            log.setLevel(level)
        full = out._local_tensors
        first = full[ranks[0]]
        for r in ranks:
            assert torch.equal(full[r], first), "torch's replicas disagree"
        return first.clone()
