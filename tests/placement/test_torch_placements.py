"""to_torch / from_torch: lossless conversion to torch DTensor placements, or an error."""

from __future__ import annotations

import pytest
from hypothesis import given
from torch.distributed.tensor import Partial as TPartial
from torch.distributed.tensor import Replicate as TReplicate
from torch.distributed.tensor import Shard as TShard
from torch.distributed.tensor._dtensor_spec import DTensorSpec, ShardOrderEntry
from torch.distributed.tensor.placement_types import _MaskPartial, _StridedShard

from meshplan.errors import PlacementError
from meshplan.layout import Mesh
from meshplan.placement import (
    Partial,
    Replicate,
    Shard,
    Spec,
    StridedShard,
    from_torch,
    local_intervals,
    to_torch,
    to_torch_shard_order,
)
from meshplan.testing import specs

M32 = Mesh.create((3, 2))


def _default_order(spec):
    return all(list(o) == sorted(o) for o in spec.shard_order.values())


@given(specs())
def test_from_torch_inverts_to_torch_with_an_explicit_order(spec):
    placements = to_torch(spec, order="separate")
    order = to_torch_shard_order(spec)
    assert from_torch(placements, spec.mesh, spec.shape, spec.dtype, shard_order=order) == spec
    bare = from_torch(placements, shard_order=order)
    assert bare == (spec.placements, dict(spec.shard_order))


@given(specs())
def test_from_torch_inverts_to_torch_in_torchs_strided_encoding(spec):
    try:
        placements = to_torch(spec)
    except PlacementError as e:
        # only an order torch would encode inexactly (or next to a StridedShard) is refused
        assert not _default_order(spec)
        assert "uneven" in str(e) or "cannot hold both" in str(e)
        return
    if _default_order(spec):
        # literal placements: from_torch reads them back as they are
        assert from_torch(placements, spec.mesh, spec.shape, spec.dtype) == spec
    else:
        reordered = [d for d, o in spec.shard_order.items() if list(o) != sorted(o)]
        back = from_torch(placements, spec.mesh, spec.shape, spec.dtype, decode_order=reordered)
        assert back == spec
        # and read literally, torch's encoding places data exactly like the order
        literal = from_torch(placements, spec.mesh, spec.shape, spec.dtype)
        for r in spec.mesh.ranks:
            assert local_intervals(literal, r) == local_intervals(spec, r)


@given(specs(allow_strided=False))
def test_to_torch_encodes_orders_like_torch_and_torch_decodes_them_back(spec):
    placements = to_torch(spec, order="separate")
    order = to_torch_shard_order(spec)
    # torch's own encoder and decoder, on a stand-in object with the mesh sizes
    mesh = _Sizes(spec.mesh.shape)
    reordered = tuple(e for e in order if list(e.mesh_dims) != sorted(e.mesh_dims))
    encoded = DTensorSpec._convert_shard_order_to_StridedShard(reordered, placements, mesh)
    try:
        ours = to_torch(spec)
    except PlacementError:
        return  # inexact for this shape: pinned in test_torch_conformance
    assert ours == encoded
    assert DTensorSpec._maybe_convert_StridedShard_to_shard_order(encoded, mesh) == order


class _Sizes:
    def __init__(self, shape):
        self.shape = shape

    def size(self, dim):
        return self.shape[dim]


def test_conversions_by_example():
    mesh = Mesh.create((2, 3), ("dp", "tp"))
    spec = Spec(mesh, (StridedShard(1, 2), Partial("min")), (4, 6))
    assert to_torch(spec) == (_StridedShard(1, split_factor=2), TPartial("min"))
    assert from_torch([_StridedShard(1, split_factor=2), TPartial("min")], mesh, (4, 6)) == spec
    assert to_torch([Shard(0), Replicate()]) == (TShard(0), TReplicate())
    ordered = Spec(mesh, (Shard(0), Shard(0)), (12,), shard_order={0: (1, 0)})
    assert to_torch(ordered) == (_StridedShard(0, split_factor=3), TShard(0))
    assert to_torch_shard_order(ordered) == (ShardOrderEntry(0, (1, 0)),)
    assert from_torch(to_torch(ordered), mesh, (12,), decode_order=True) == ordered
    assert to_torch_shard_order([Shard(1), Shard(1)], {1: (1, 0)}) == (ShardOrderEntry(1, (1, 0)),)


@pytest.mark.parametrize(
    ("call", "needles"),
    [
        # orders torch 2.13 would misplace when encoded as _StridedShard
        (lambda m: to_torch(Spec(M32, (Shard(0), Shard(0)), (7,), shard_order={0: (1, 0)})),
         ["uneven", "('d1', 'd0')", "order='separate'"]),
        # an order next to a StridedShard of the same dim has no torch encoding
        (lambda m: to_torch(Spec(m, (StridedShard(0, 2), Shard(0)), (12,), shard_order={0: (1, 0)})),
         ["cannot hold both"]),
        (lambda m: to_torch([Shard(0), Shard(0)], {0: (1, 0)}), ["pass a Spec"]),
        (lambda m: to_torch([Shard(0), TShard(0)]), ["not a meshplan placement"]),
        (lambda m: to_torch([Shard(0), Shard(0)], {0: (1,)}), ["exactly once"]),
        (lambda m: to_torch(Spec(m, (Shard(0), Shard(0)), (6,)), order="torch"), ["order must"]),
        (lambda m: to_torch(Spec(m, (Shard(0), Shard(0)), (6,)), {0: (1, 0)}), ["its own shard"]),
        # torch placements meshplan cannot say without losing meaning
        (lambda m: from_torch([TPartial("product"), TReplicate()], m, (4,)), ["'product'"]),
        (lambda m: from_torch([_MaskPartial(), TReplicate()], m, (4,)), ["_MaskPartial", "lose"]),
        (lambda m: from_torch([Shard(0), TReplicate()], m, (4,)), ["no meshplan counterpart"]),
        # decoding where torch's encoding and its literal reading disagree, or nothing fits
        (lambda m: from_torch([_StridedShard(0, split_factor=2), TShard(0)], M32, (7,),
                              decode_order=True), ["uneven", "decode_order=False"]),
        (lambda m: from_torch([TShard(0), _StridedShard(0, split_factor=2)], m, (12,),
                              decode_order=True), ["do not encode a shard order"]),
        (lambda m: from_torch([_StridedShard(0, split_factor=3), TShard(0)], m, (12,),
                              shard_order={0: (0, 1)}, decode_order=True), ["one or the other"]),
        (lambda m: from_torch([TShard(0), TShard(0)], m), ["both mesh and shape"]),
        (lambda m: from_torch([TShard(0), TShard(0)], decode_order=True), ["needs the mesh"]),
        (lambda m: from_torch([TShard(0), TShard(0)], m, (4,), decode_order=[3]), ["names 3"]),
        (lambda m: from_torch([TShard(0), TShard(0)], "mesh", (4,)), ["'mesh'"]),
        # malformed explicit orders
        (lambda m: from_torch([TShard(0), TShard(0)], m, (8,), shard_order=[(0,)]),
         ["[(0,)]", "not a shard order"]),
        (lambda m: from_torch([TShard(0), TShard(0)], m, (8,), shard_order=[1]), ["[1]"]),
        (lambda m: from_torch([TShard(0), TShard(0)], m, (8,), shard_order={0: None}),
         ["{0: None}"]),
    ],
)  # fmt: skip
def test_lossy_conversions_raise(call, needles):
    with pytest.raises(PlacementError) as info:
        call(Mesh.create((2, 3), ("dp", "tp")))
    for needle in needles:
        assert needle in str(info.value)


def test_from_torch_takes_a_device_mesh():
    from _torch_oracle import ensure_fake_world, torch_mesh

    ensure_fake_world(8)
    dm = torch_mesh((2, 2), ("dp", "tp"), [0, 2, 1, 3])
    spec = from_torch([TShard(0), TReplicate()], dm, (4,))
    assert spec.mesh == Mesh.create((2, 2), ("dp", "tp"), ranks=[0, 2, 1, 3])


def test_bare_placements_may_come_from_a_generator():
    # the placements are read once: a generator is not exhausted before its order is found
    order = {0: (1, 0)}
    got = to_torch_shard_order((p for p in (Shard(0), Shard(0))), shard_order=order)
    assert got == (ShardOrderEntry(tensor_dim=0, mesh_dims=(1, 0)),)
    assert to_torch((p for p in (Shard(0), Replicate())), order="separate") == (
        TShard(0),
        TReplicate(),
    )
