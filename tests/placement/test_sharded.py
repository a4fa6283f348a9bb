"""Sharded: one rank's local tensor with its spec, checked on construction."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given

from meshplan.errors import PlacementError
from meshplan.layout import Mesh
from meshplan.placement import (
    Shard,
    Sharded,
    Spec,
    StridedShard,
    global_offset,
    local_chunks,
    shard,
    unshard,
)
from meshplan.testing import meshes, specs


@given(specs(mesh=meshes(max_dims=2, max_side=3, max_rank_offset=2), max_side=7))
def test_sharded_values_reassemble_the_tensor(spec):
    x = torch.arange(spec.numel(), dtype=torch.float32).reshape(spec.shape)
    values = [Sharded.from_global(x, spec, r) for r in shard(x, spec)]
    for v in values:
        assert v.shape == spec.shape and v.local_shape == tuple(v.local.shape)
        assert v.global_offset == global_offset(spec, v.rank)
        assert v.chunks() == local_chunks(spec, v.rank)
        assert spec.mesh.rank_at(v.coordinate) == v.rank
    assert torch.equal(unshard({v.rank: v.local for v in values}, spec), x)


def test_sharded_checks_rank_shape_and_dtype():
    spec = Spec(Mesh.create(2, ranks=[4, 5]), (StridedShard(0, 2),), (8,))
    v = Sharded(torch.zeros(4), spec, 5)
    assert repr(v) == "Sharded(rank=5, spec=f32[8](SS(0,2)), local_shape=(4,))"
    with pytest.raises(PlacementError, match="rank 0 is not in mesh"):
        Sharded(torch.zeros(4), spec, 0)
    with pytest.raises(PlacementError, match=r"shape \(3,\).*gives it \(4,\)"):
        Sharded(torch.zeros(3), spec, 4)
    with pytest.raises(PlacementError, match="dtype float64"):
        Sharded(torch.zeros(4, dtype=torch.float64), spec, 4)
    with pytest.raises(PlacementError, match="torch.Tensor"):
        Sharded([0.0] * 4, spec, 4)
    with pytest.raises(PlacementError, match="needs a Spec"):
        Sharded(torch.zeros(4), "S(0)", 4)
    with pytest.raises(PlacementError, match="shape"):
        v.with_local(torch.zeros(5))


def test_sharded_is_hashable_and_compares_by_identity():
    spec = Spec(Mesh.create(2), (Shard(0),), (4,))
    a = Sharded(torch.zeros(2), spec, 0)
    b = Sharded(torch.zeros(2), spec, 0)
    assert a == a and a != b and len({a, b}) == 2
