"""The JAX view: PartitionSpec <-> Spec, lossless or raising."""

from __future__ import annotations

import pytest
from hypothesis import given

from meshplan.errors import PlacementError
from meshplan.layout import Mesh
from meshplan.placement import (
    Partial,
    PartitionSpec,
    Replicate,
    Shard,
    Spec,
    StridedShard,
    from_partition_spec,
    local_intervals,
    partition_spec,
)
from meshplan.testing import specs

MESH = Mesh.create((2, 2, 3), ("dp", "tp", "cp"))


@given(specs(allow_strided=False))
def test_from_partition_spec_inverts_partition_spec(spec):
    p = spec.partition_spec()
    assert Spec.from_partition_spec(spec.mesh, spec.shape, p, dtype=spec.dtype) == spec
    # the plain-tuple form with an explicit partial map says the same
    again = from_partition_spec(spec.mesh, spec.shape, tuple(p), dict(p.partial), spec.dtype)
    assert again == spec


@given(specs(allow_strided=False, allow_partial=False))
def test_partition_spec_entries_list_mesh_dims_major_first(spec):
    # entry (a, b) of dim d: a's coordinate picks the bigger block, b splits inside it
    p = partition_spec(spec)
    for d, entry in enumerate(p):
        assert (entry or ()) == tuple(spec.mesh.names[m] for m in spec.order(d))


def test_jax_style_example():
    s = Spec.from_partition_spec(MESH, (8, 6), (("dp", "tp"), None), partial={"cp": "sum"})
    assert s.placements == (Shard(0), Shard(0), Partial("sum"))
    assert s.partition_spec() == PartitionSpec(("dp", "tp"), None, partial={"cp": "sum"})
    # tp-major: the tp coordinate picks the half, dp the quarter inside it
    t = Spec.from_partition_spec(MESH, (8, 6), (("tp", "dp"),))
    assert dict(t.shard_order) == {0: (1, 0)}
    rank_dp1_tp0 = MESH.rank_at((1, 0, 0))
    assert local_intervals(t, rank_dp1_tp0)[0] == ((2, 4),)


def test_short_specs_names_indices_and_single_names():
    a = Spec.from_partition_spec(MESH, (8, 6, 2), ["tp", (0,)])
    b = Spec.from_partition_spec(MESH, (8, 6, 2), (("tp",), ("dp",), None))
    assert a == b == Spec(MESH, (Shard(1), Shard(0), Replicate()), (8, 6, 2))


def test_a_shape_given_as_an_iterator_is_read_once():
    s = Spec.from_partition_spec(MESH, iter((8, 4)), ("dp", None))
    assert s.shape == (8, 4) and s == Spec.from_partition_spec(MESH, (8, 4), ("dp", None))


def test_size_one_mesh_dims_drop_out():
    mesh = Mesh.create((1, 4), ("pp", "tp"))
    s = Spec.from_partition_spec(mesh, (8,), (("pp", "tp"),), partial=None)
    assert s.partition_spec() == PartitionSpec("tp")


def test_partition_spec_value():
    p = PartitionSpec(("dp", "tp"), "cp", None, partial={"ep": "max"})
    assert len(p) == 3 and p[1] == ("cp",) and list(p)[2] is None
    assert p == PartitionSpec(("dp", "tp"), ("cp",), None, partial={"ep": "max"})
    assert hash(p) == hash(PartitionSpec(("dp", "tp"), ("cp",), None, partial={"ep": "max"}))
    assert repr(p) == "PartitionSpec(('dp', 'tp'), 'cp', None, partial={'ep': 'max'})"
    assert PartitionSpec((), None) == PartitionSpec(None, None)


@pytest.mark.parametrize(
    ("make", "needles"),
    [
        (lambda: Spec(MESH, (StridedShard(0, 2),) + (Replicate(),) * 2, (8,)).partition_spec(),
         ["StridedShard(0, 2)", "'dp'", "no partition-spec form"]),
        (lambda: Spec.from_partition_spec(MESH, (8,), ("dp", "tp")),
         ["2 entries", "1-D tensor"]),
        (lambda: Spec.from_partition_spec(MESH, (8, 8), ("dp", "dp")),
         ["'dp'", "used twice", "tensor dim 0", "tensor dim 1"]),
        (lambda: Spec.from_partition_spec(MESH, (8,), ("dp",), partial={"dp": "sum"}),
         ["'dp'", "used twice", "partial 'sum'"]),
        (lambda: Spec.from_partition_spec(MESH, (8,), ("ep",)), ["'ep'", "unknown mesh dim"]),
        (lambda: Spec.from_partition_spec(MESH, (8,), (), partial={"dp": "prod"}),
         ["'prod'", "unknown reduce op"]),
        (lambda: Spec.from_partition_spec(MESH, (8,), (), partial={"dp": "sum", "tp": "max"}),
         ["mix Partial ops"]),
        (lambda: Spec.from_partition_spec(MESH, (8,), "dp"), ["'dp'", "sequence"]),
        (lambda: Spec.from_partition_spec(MESH, (8,), ((1.5,),)), ["1.5"]),
        (lambda: Spec.from_partition_spec(MESH, (8,), (), partial=["dp"]), ["['dp']", "map"]),
        (lambda: Spec.from_partition_spec(MESH, 8, ("dp",)), ["global shape 8", "sequence"]),
    ],
)  # fmt: skip
def test_invalid_partition_specs_raise(make, needles):
    with pytest.raises(PlacementError) as info:
        make()
    for needle in needles:
        assert needle in str(info.value)
