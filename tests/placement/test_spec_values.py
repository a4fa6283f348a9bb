"""Spec validation (every invalid spec raises PlacementError naming value and rule) and
canonical form (equivalent specs compare equal)."""

from __future__ import annotations

import attrs
import pytest
from _placement_model import expand, held_indices
from hypothesis import given
from hypothesis import strategies as st

from meshplan.errors import PlacementError
from meshplan.layout import Mesh
from meshplan.placement import (
    Partial,
    Replicate,
    Shard,
    Spec,
    StridedShard,
    dtype_itemsize,
    dtype_name,
    local_intervals,
)
from meshplan.testing import placements, specs

MESH = Mesh.create((2, 3), ("dp", "tp"))
ONE = Mesh.create((2, 1), ("a", "b"))


# -- invalid specs ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("make", "needles"),
    [
        # shard dim out of range
        (lambda: Spec(MESH, (Shard(2), Replicate()), (4, 4)), ["Shard(2)", "'dp'", "out of range"]),
        (lambda: Spec(MESH, (Replicate(), Shard(-3)), (4, 4)), ["Shard(-3)", "[-2, 2)"]),
        (
            lambda: Spec(MESH, (StridedShard(1, 2), Replicate()), (4,)),
            ["StridedShard(1, 2)", "1-D tensor"],
        ),
        (lambda: Spec(MESH, (Shard(0), Replicate()), ()), ["Shard(0)", "0-D tensor"]),
        # wrong number of placements
        (lambda: Spec(MESH, (Shard(0),), (4,)), ["1 placements", "2-D mesh", "one placement"]),
        (
            lambda: Spec(MESH, (Shard(0), Replicate(), Replicate()), (4,)),
            ["3 placements", "('dp', 'tp')"],
        ),
        # mixed Partial ops
        (
            lambda: Spec(MESH, (Partial("sum"), Partial("max")), (4,)),
            ["mix Partial ops", "['max', 'sum']", "only sum and avg"],
        ),
        (lambda: Spec(MESH, (Partial("min"), Partial("avg")), (4,)), ["['avg', 'min']"]),
        (
            lambda: Spec(MESH, (Partial("max"), Replicate()), (4,), "complex64"),
            ["complex64", "['max']", "no order"],
        ),
        (lambda: Spec(MESH, (Partial("avg"), Replicate()), (4,), "bool"), ["bool", "no average"]),
        # shard order omits or invents a mesh dim
        (
            lambda: Spec(MESH, (Shard(0), Shard(0)), (8,), shard_order={0: ("tp",)}),
            ["('tp',)", "('dp', 'tp')", "neither omit nor invent"],
        ),
        (
            lambda: Spec(MESH, (Shard(0), Replicate()), (8,), shard_order={0: ("tp", "dp")}),
            ["('tp', 'dp')", "('dp',)", "invent"],
        ),
        (
            lambda: Spec(MESH, (Shard(0), Shard(0)), (8,), shard_order={0: (1, 1, 0)}),
            ["(1, 1, 0)", "exactly once"],
        ),
        (lambda: Spec(MESH, (Shard(0), Shard(0)), (8,), shard_order={0: ("dp", "pp")}), ["'pp'"]),
        (lambda: Spec(MESH, (Shard(0), Shard(0)), (8,), shard_order={1: (0, 1)}), ["key 1"]),
        (
            lambda: Spec(MESH, (Shard(0), Shard(1)), (8, 2), shard_order={0: (0,), -2: (0,)}),
            ["twice"],
        ),
        # size-1 mesh dims may be listed (their placement does not matter), but once
        (
            lambda: Spec(ONE, (Shard(0), Shard(0)), (4,), shard_order={0: ("a", "b", "b")}),
            ["('a', 'b', 'b')", "exactly once"],
        ),
        (
            lambda: Spec(ONE, (Shard(0), Shard(1)), (4, 4), shard_order={0: ("b", "a"), 1: "b"}),
            ["('b',)", "exactly once"],
        ),
        (
            lambda: Spec(MESH, (Shard(0), Shard(0)), (8,), shard_order={0: {1, 0}}),
            ["the set {0, 1}", "no order"],
        ),
        (lambda: Spec(MESH, (Shard(0), Shard(0)), (8,), shard_order=7), ["shard_order 7"]),
        (lambda: Spec(MESH, (Shard(0), Shard(0)), (8,), shard_order={0: None}), ["None"]),
        # shapes, dtypes, meshes, placements of the wrong kind
        (lambda: Spec(MESH, (Shard(0), Replicate()), (4, -1)), ["(4, -1)", ">= 0"]),
        (lambda: Spec(MESH, (Shard(0), Replicate()), 4), ["global shape 4"]),
        (lambda: Spec(MESH, (Shard(0), Replicate()), (4,), "float7"), ["'float7'"]),
        (lambda: Spec((2, 3), (Shard(0), Replicate()), (4,)), ["needs a Mesh", "(2, 3)"]),
        (lambda: Spec(MESH, (Shard(0), "R"), (4,)), ["'R'", "'tp'", "not a meshplan placement"]),
        (lambda: Spec(MESH, "S(0) R", (4,)), ["parse_placements"]),
    ],
)
def test_invalid_spec_raises_placement_error_naming_value_and_rule(make, needles):
    with pytest.raises(PlacementError) as info:
        make()
    for needle in needles:
        assert needle in str(info.value)
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize(
    ("make", "needles"),
    [
        (lambda: Partial("prod"), ["'prod'", "unknown reduce op", "'sum'"]),
        (lambda: StridedShard(0, 0), ["split_factor", "0", ">= 1"]),
        (lambda: StridedShard(0, -2), ["-2", ">= 1"]),
        (lambda: StridedShard(0, 2.0), ["2.0"]),
        (lambda: Shard("0"), ["'0'", "int tensor dim"]),
        (lambda: Shard(True), ["True"]),
    ],
)
def test_invalid_placement_raises_placement_error(make, needles):
    with pytest.raises(PlacementError) as info:
        make()
    for needle in needles:
        assert needle in str(info.value)


def test_torch_placement_in_spec_points_to_from_torch():
    from torch.distributed.tensor import Shard as TShard

    with pytest.raises(PlacementError, match="from_torch"):
        Spec(MESH, (TShard(0), Replicate()), (4,))


# -- canonical form --------------------------------------------------------------------


def test_placement_on_a_size_one_mesh_dim_does_not_matter():
    mesh = Mesh.create((1, 4), ("pp", "tp"))
    base = Spec(mesh, (Replicate(), Shard(0)), (8,))
    for p in (Shard(0), StridedShard(0, 3), Partial("max")):
        assert Spec(mesh, (p, Shard(0)), (8,)) == base
    # and a shard order may list or leave out the size-1 dim
    assert Spec(mesh, (Shard(0), Shard(0)), (8,), shard_order={0: ("tp", "pp")}) == base


def test_strided_shard_with_split_factor_one_is_shard():
    assert Spec(MESH, (StridedShard(1, 1), Replicate()), (4, 4)) == Spec(
        MESH, (Shard(1), Replicate()), (4, 4)
    )


def test_negative_dims_are_normalized():
    s = Spec(MESH, (Shard(-1), StridedShard(-2, 2)), (4, 6), shard_order={-1: "dp"})
    assert s.placements == (Shard(1), StridedShard(0, 2))
    assert s == Spec(MESH, (Shard(1), StridedShard(0, 2)), (4, 6))


def test_order_and_dim_intervals_take_negative_tensor_dims_and_check_their_arguments():
    from meshplan.placement import dim_intervals

    s = Spec(MESH, (Replicate(), Shard(-1)), (4, 9))
    assert s.order(-1) == s.order(1) == (1,)
    assert s.order(-2) == s.order(0) == ()
    assert dim_intervals(s, (0, 2), -1) == dim_intervals(s, (0, 2), 1) == ((6, 9),)
    for bad_dim in (2, -3, "0", True):
        with pytest.raises(PlacementError, match="not a tensor dim"):
            s.order(bad_dim)
        with pytest.raises(PlacementError, match="not a tensor dim"):
            dim_intervals(s, (0, 0), bad_dim)
    for bad_coord in ((0, 3), (0, -1), (0,), (0, 0, 0), (0, 1.0)):
        with pytest.raises(PlacementError, match="not a coordinate"):
            dim_intervals(s, bad_coord, 1)


def test_explicit_default_order_equals_implicit_and_names_equal_indices():
    implicit = Spec(MESH, (Shard(0), Shard(0)), (12,))
    assert Spec(MESH, (Shard(0), Shard(0)), (12,), shard_order={0: ("dp", "tp")}) == implicit
    assert Spec(MESH, (Shard(0), Shard(0)), (12,), shard_order={0: (0, 1)}) == implicit
    assert Spec(MESH, (Shard(0), Shard(0)), (12,), shard_order={0: (-1, -2)}) != implicit
    assert hash(Spec(MESH, (Shard(0), Shard(0)), (12,), shard_order={0: (0, 1)})) == hash(implicit)


def test_dtype_names_are_canonical():
    assert Spec(MESH, (Replicate(),) * 2, (2,), "f16").dtype == "float16"
    import torch

    assert Spec(MESH, (Replicate(),) * 2, (2,), torch.bfloat16).dtype == "bfloat16"
    assert dtype_name("c64") == "complex64" and dtype_itemsize("bf16") == 2


@given(specs())
def test_canonical_form_is_a_fixed_point(spec):
    again = Spec(spec.mesh, spec.placements, spec.shape, spec.dtype, spec.shard_order)
    assert again == spec and hash(again) == hash(spec)
    assert attrs.evolve(spec) == spec
    assert spec.with_placements(spec.placements, spec.shard_order) == spec
    assert eval(repr(spec), _namespace()) == spec


@given(specs())
def test_shard_order_lists_exactly_the_mesh_dims_sharding_each_tensor_dim(spec):
    for d in range(spec.ndim):
        sharding = [
            m
            for m, p in enumerate(spec.placements)
            if isinstance(p, Shard | StridedShard) and p.dim == d
        ]
        assert sorted(spec.order(d)) == sharding
    assert all(spec.mesh.shape[m] > 1 for o in spec.shard_order.values() for m in o)


@given(specs(mesh=Mesh.create((2, 1, 3)), min_dims=1), st.data())
def test_uncanonical_spellings_hold_the_same_data(spec, data):
    # respell the spec: negative dims, StridedShard(d, 1), anything on the size-1 dim
    ndim = spec.ndim
    raw = []
    for m, p in enumerate(spec.placements):
        if spec.mesh.shape[m] == 1:
            p = data.draw(placements(ndim=ndim, partial_ops=["max"]))
        elif isinstance(p, Shard):
            p = data.draw(st.sampled_from([Shard(p.dim - ndim), StridedShard(p.dim, 1)]))
        raw.append(p)
    order = {d - ndim: tuple(spec.mesh.names[m] for m in o) for d, o in spec.shard_order.items()}
    respelled = Spec(spec.mesh, raw, spec.shape, spec.dtype, order)
    assert respelled == spec
    # and the respelling, read as written (brute force), holds what the spec holds
    raw_order = {d % ndim: [spec.mesh.dim_index(n) for n in o] for d, o in order.items()}
    for rank in range(spec.mesh.size()):
        coord = spec.mesh.coordinate(rank)
        want = held_indices(raw, spec.mesh.shape, spec.shape, coord, raw_order)
        assert [expand(ivs) for ivs in local_intervals(spec, rank)] == list(want)


def _namespace():
    from meshplan.layout import Axis, FrozenMap, MeshLayout

    return {
        "Spec": Spec,
        "Mesh": Mesh,
        "MeshLayout": MeshLayout,
        "Axis": Axis,
        "FrozenMap": FrozenMap,
        "Shard": Shard,
        "StridedShard": StridedShard,
        "Replicate": Replicate,
        "Partial": Partial,
    }
