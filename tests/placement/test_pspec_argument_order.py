"""from_partition_spec takes (mesh, pspec, shape) like Spec(mesh, placements, shape), and
still accepts the older (mesh, shape, pspec)."""

import pytest
from hypothesis import given

from meshplan.errors import PlacementError
from meshplan.layout import Mesh
from meshplan.placement import PartitionSpec, Spec, from_partition_spec
from meshplan.testing import specs


@given(specs(allow_strided=False))
def test_both_argument_orders_and_keywords_give_the_same_spec(spec):
    p = spec.partition_spec()
    plain = tuple(p)
    new = Spec.from_partition_spec(spec.mesh, p, spec.shape, dtype=spec.dtype)
    old = Spec.from_partition_spec(spec.mesh, spec.shape, p, dtype=spec.dtype)
    named = from_partition_spec(spec.mesh, pspec=p, shape=spec.shape, dtype=spec.dtype)
    assert new == old == named == spec
    assert from_partition_spec(spec.mesh, plain, spec.shape, dict(p.partial), spec.dtype) == spec


def test_index_pspecs_are_told_from_shapes_by_the_mesh():
    mesh = Mesh.create((2, 2), ("dp", "tp"))
    want = Spec.from_partition_spec(mesh, pspec=(1, None), shape=(8, 4))
    assert Spec.from_partition_spec(mesh, (8, 4), (1,)) == Spec.from_partition_spec(
        mesh, (1,), (8, 4)
    )
    assert Spec.from_partition_spec(mesh, ((1,), None), (8, 4)) == want


def test_an_order_that_cannot_be_told_asks_for_keywords():
    mesh = Mesh.create((2, 2), ("dp", "tp"))
    with pytest.raises(PlacementError, match=r"PartitionSpec\(\*\(0, 1\)\)"):
        Spec.from_partition_spec(mesh, (0, 1), (1, 0))
    assert Spec.from_partition_spec(mesh, PartitionSpec(0, 1), (1, 0)).shape == (1, 0)
    assert Spec.from_partition_spec(mesh, (1, 0), PartitionSpec(0, 1)).shape == (1, 0)
