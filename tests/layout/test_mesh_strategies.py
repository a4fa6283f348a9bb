"""The public mesh strategies validate their arguments and draw what they promise."""

import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from meshplan.layout import Mesh
from meshplan.testing import mesh_dims, meshes


@pytest.mark.parametrize(
    "kwargs",
    [
        {"min_dims": -1},
        {"min_dims": 3, "max_dims": 2},
        {"max_dims": 1.5},
        {"min_side": 0},
        {"min_side": 3, "max_side": 2},
        {"max_side": True},
        {"permuted": "yes"},
        {"max_rank_offset": -1},
        {"max_aliases": None},
        {"max_side": 64, "max_dims": 4},
    ],
)
def test_meshes_rejects_bad_arguments(kwargs):
    with pytest.raises(InvalidArgument):
        meshes(**kwargs).validate()


def test_meshes_takes_keywords_only():
    with pytest.raises(TypeError):
        meshes(1, 2)


@pytest.mark.parametrize(
    "kwargs",
    [{"min_size": -1}, {"min_size": 2, "max_size": 1}, {"min_size": 4}, {"aliases": 1}],
)
def test_mesh_dims_rejects_bad_arguments(kwargs):
    with pytest.raises(InvalidArgument):
        mesh_dims(Mesh.create((2, 2, 2)), **kwargs).validate()
    with pytest.raises(InvalidArgument):
        mesh_dims("not a mesh").validate()


@given(
    st.integers(0, 3).flatmap(
        lambda lo: st.tuples(st.just(lo), st.integers(lo, 3), st.integers(1, 3))
    ),
    st.data(),
)
def test_meshes_respect_their_bounds(bounds, data):
    min_dims, max_dims, max_side = bounds
    permuted = data.draw(st.sampled_from([None, True, False]))
    mesh = data.draw(
        meshes(
            min_dims=min_dims,
            max_dims=max_dims,
            max_side=max_side,
            permuted=permuted,
            max_rank_offset=5,
            max_aliases=2,
        )
    )
    assert min_dims <= mesh.ndim <= max_dims
    assert all(1 <= s <= max_side for s in mesh.shape)
    assert min(mesh.ranks) <= 5 and len(mesh.ranks) == mesh.size()
    if permuted is False:
        assert isinstance(mesh.ranks, range)
    assert len(mesh.aliases) <= 2


@given(meshes(max_aliases=3), st.data())
def test_mesh_dims_are_distinct_and_sliceable(mesh, data):
    dims = data.draw(mesh_dims(mesh, aliases=True))
    assert len(set(dims)) == len(dims)
    assert mesh[dims].names == dims  # valid: no two picks share ranks


@given(meshes(min_dims=1), st.data())
def test_mesh_dims_respect_size_bounds(mesh, data):
    lo = data.draw(st.integers(0, mesh.ndim))
    hi = data.draw(st.integers(lo, mesh.ndim))
    dims = data.draw(mesh_dims(mesh, min_size=lo, max_size=hi))
    assert lo <= len(dims) <= hi and set(dims) <= set(mesh.names)
