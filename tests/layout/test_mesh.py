"""Laws of Mesh: groups, slicing, flattening, unflattening, coordinates, submeshes.

The oracle is the brute-force numpy model in ``_layout_model.py``.
"""

import math
import pickle

import pytest
from _layout_model import ModelError, meshes_with_models
from hypothesis import assume, event, given
from hypothesis import strategies as st

from meshplan.errors import MeshError
from meshplan.layout import Mesh
from meshplan.testing import mesh_dims, meshes

pairs = meshes_with_models()


def factorizations(n: int) -> st.SearchStrategy[tuple[int, ...]]:
    """Ordered factorizations of ``n`` (size-1 factors included)."""
    divisors = [d for d in range(1, n + 1) if n % d == 0]

    @st.composite
    def build(draw):
        out, rest = [], n
        for _ in range(draw(st.integers(0, 3))):
            d = draw(st.sampled_from([d for d in divisors if rest % d == 0]))
            out.append(d)
            rest //= d
        return (*out, rest)

    return build()


@given(pairs, st.data())
def test_groups_partition_the_rank_map(pair, data):
    mesh, _ = pair
    dims = data.draw(mesh_dims(mesh, aliases=True))
    groups = mesh.groups(dims)
    flat = [r for g in groups for r in g]
    assert sorted(flat) == sorted(mesh.ranks)
    assert {len(g) for g in groups} == {math.prod(mesh.size(d) for d in dims)}


@given(pairs, st.data())
def test_groups_equal_brute_force(pair, data):
    mesh, model = pair
    dims = data.draw(mesh_dims(mesh, aliases=True))
    assert mesh.groups(dims) == model.groups(dims)


@given(pairs, st.data())
def test_group_of_is_the_group_containing_rank(pair, data):
    mesh, _ = pair
    dims = data.draw(mesh_dims(mesh, aliases=True))
    rank = data.draw(st.sampled_from(mesh.ranks))
    (expected,) = [g for g in mesh.groups(dims) if rank in g]
    assert mesh.group_of(rank, dims) == expected


@given(pairs, st.data())
def test_slicing_equals_brute_force(pair, data):
    mesh, model = pair
    dims = data.draw(mesh_dims(mesh, aliases=True, min_size=1))
    sub, sub_model = mesh[dims], model.slice(dims)
    assert sub.names == sub_model.names and sub.shape == sub_model.shape
    assert set(sub.aliases) == set(sub_model.aliases)
    for d in sub.names + tuple(sub.aliases):
        assert sub.groups(d) == sub_model.groups((d,))
    assert sub.groups() == sub_model.groups()


@given(pairs, st.data())
def test_flatten_then_slice_equals_slice_then_flatten(pair, data):
    mesh, _ = pair
    kept = data.draw(mesh_dims(mesh, min_size=1))
    flat_dims = data.draw(st.permutations(kept).flatmap(lambda p: st.just(p[: len(p) // 2 + 1])))
    a = mesh.flatten(flat_dims, "x")[kept]
    b = mesh[kept].flatten(flat_dims, "x")
    assert a == b
    assert a["x"].groups() == mesh.groups(flat_dims)
    rest = tuple(d for d in kept if d not in flat_dims)
    assert mesh.flatten(flat_dims, "x")[("x", *rest)] == b[("x", *rest)]


@given(pairs, st.data())
def test_unflatten_inverts_flatten(pair, data):
    mesh, _ = pair
    dims = data.draw(mesh_dims(mesh, min_size=1))
    rest = data.draw(mesh_dims(mesh[[d for d in mesh.names if d not in dims]]))
    flat = mesh.flatten(dims, "x")[("x", *rest)]
    back = flat.unflatten("x", [mesh.size(d) for d in dims], dims)
    assert back.layout == mesh[(*dims, *rest)].layout
    assert back.names == (*dims, *rest)


@given(pairs, st.data())
def test_flatten_inverts_unflatten(pair, data):
    mesh, _ = pair
    dim = data.draw(st.sampled_from(mesh.names))
    sizes = data.draw(factorizations(mesh.size(dim)))
    names = tuple(f"u{i}" for i in range(len(sizes)))
    split = mesh.unflatten(dim, sizes, names)
    assert split.flatten(names, "y")["y"].groups() == mesh.groups(dim)
    assert split[names].groups() == mesh.groups(dim)


@given(pairs, st.data())
def test_unflatten_equals_brute_force(pair, data):
    mesh, model = pair
    sliced = data.draw(mesh_dims(mesh, aliases=True, min_size=1))
    mesh, model = mesh[sliced], model.slice(sliced)
    dim = data.draw(st.sampled_from(mesh.names))
    sizes = data.draw(factorizations(mesh.size(dim)))
    names = tuple(f"u{i}" for i in range(len(sizes)))
    try:
        expected = model.unflatten(dim, sizes, names)
    except ModelError:
        expected = None
    if expected is None:
        # Only a non-adjacent flattening whose modes the sizes do not split may refuse.
        event("unflatten refused")
        assert len(mesh.axis(dim).sizes) > 1
        with pytest.raises(MeshError, match="cannot unflatten"):
            mesh.unflatten(dim, sizes, names)
        return
    event("unflatten accepted")
    split = mesh.unflatten(dim, sizes, names)
    for d in split.names + tuple(split.aliases):
        assert split.groups(d) == expected.groups((d,))


@given(pairs, st.data())
def test_coordinate_and_rank_at_round_trip(pair, data):
    mesh, model = pair
    dims = data.draw(mesh_dims(mesh, aliases=True))
    mesh, model = mesh[dims], model.slice(dims)
    rank = data.draw(st.sampled_from(mesh.ranks))
    coord = mesh.coordinate(rank)
    assert coord == model.coordinate(rank)
    assert mesh.rank_at(coord, at=rank) == rank
    other = tuple(data.draw(st.integers(0, s - 1)) for s in mesh.shape)
    assert mesh.coordinate(mesh.rank_at(other, at=rank)) == other
    assert mesh.rank_at(other, at=rank) in mesh.group_of(rank)


@given(pairs, st.data())
def test_coordinate_orders_group_of(pair, data):
    mesh, _ = pair
    rank = data.draw(st.sampled_from(mesh.ranks))
    group = mesh.group_of(rank)
    coords = [mesh.coordinate(r) for r in group]
    assert coords == sorted(coords) and len(set(coords)) == len(coords)


@given(pairs, st.data())
def test_submesh_is_the_group_of_its_rank(pair, data):
    mesh, _ = pair
    dims = data.draw(mesh_dims(mesh, aliases=True))
    rank = data.draw(st.sampled_from(mesh.ranks))
    sub = mesh.submesh(dims, at=rank)
    assert tuple(sub.ranks) == mesh.group_of(rank, dims)
    assert sub.shape == mesh[dims].shape and sub.names == mesh[dims].names
    family = mesh[dims]
    assert set(sub.aliases) == set(family.aliases)
    for name in sub.aliases:
        # The same groups (each in the same order); the list order follows the submesh's
        # own coordinates.
        inside = [g for g in family.groups(name) if set(g) <= set(sub.ranks)]
        assert sorted(sub.groups(name)) == sorted(inside)
    for d in sub.names:
        assert sub.group_of(rank, d) == mesh.group_of(rank, d)


@given(pairs, st.data())
def test_slicing_keeps_exactly_the_aliases_inside(pair, data):
    mesh, model = pair
    dims = data.draw(mesh_dims(mesh, min_size=1))
    for name in mesh.aliases:
        assert (name in mesh[dims].aliases) == model.contains_alias(name, dims)


@given(meshes(max_aliases=2))
def test_slicing_every_dim_in_order_is_identity(mesh):
    assert mesh[mesh.names] == mesh
    assert mesh[:] == mesh


@given(meshes(max_aliases=2))
def test_mesh_pickles_and_hashes(mesh):
    again = pickle.loads(pickle.dumps(mesh))
    assert again == mesh and hash(again) == hash(mesh)
    assert again.groups() == mesh.groups()


@given(meshes(permuted=False, max_rank_offset=8))
def test_rank_maps_are_canonical(mesh):
    listed = Mesh.create(mesh.shape, mesh.names, list(mesh.ranks))
    assert listed == mesh and hash(listed) == hash(mesh)
    assert isinstance(listed.ranks, range)


@given(pairs, st.data())
def test_equal_layouts_behave_alike(pair, data):
    # Two routes to one submesh (slice all at once, or slice twice) compare equal and
    # give the same groups.
    mesh, _ = pair
    outer = data.draw(mesh_dims(mesh, min_size=1))
    inner = data.draw(st.permutations(outer))
    assert mesh[outer][inner] == mesh[inner]
    assert mesh[outer][inner].groups() == mesh[inner].groups()


@given(pairs, st.data())
def test_indices_and_names_slice_alike(pair, data):
    mesh, _ = pair
    dims = data.draw(mesh_dims(mesh))
    indices = tuple(mesh.names.index(d) for d in dims)
    negative = tuple(i - mesh.ndim for i in indices)
    assert mesh[indices] == mesh[dims] == mesh[negative]


def test_size_one_dims_keep_their_place():
    # torch #169381: flatten + slice with size-1 dims.
    mesh = Mesh.create((1, 1, 1, 1), ("d1", "d2", "d3", "d4")).flatten(("d2", "d3"), "d23")
    sub = mesh["d1", "d23", "d4"]
    assert sub.shape == (1, 1, 1) and sub.names == ("d1", "d23", "d4")
    assert sub.groups() == ((0,),)
    mesh = Mesh.create((2, 1, 1, 2), ("a", "b", "c", "d")).flatten(("b", "c"), "bc")
    assert mesh["a", "bc", "d"].groups() == ((0, 1, 2, 3),)
    assert mesh["bc", "a"].groups() == ((0, 2), (1, 3))
    assert mesh.coordinate(3) == (1, 0, 0, 1)
    assert mesh["a", "bc", "d"].coordinate(3) == (1, 0, 1)


@given(pairs)
def test_axis_and_size_agree(pair):
    mesh, _ = pair
    for d in mesh.names + tuple(mesh.aliases):
        assert mesh.size(d) == mesh.axis(d).size() == len(mesh.groups(d)[0])
    assume(mesh.ndim > 0)
    assert mesh.size() == math.prod(mesh.shape)
