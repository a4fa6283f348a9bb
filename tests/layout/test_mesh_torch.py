"""Conformance with torch 2.13 DeviceMesh (fake process group, one process).

Random meshes (1-4 dims, sizes 1-4; identity, permuted and subset-of-a-bigger-world
rank maps) under slicing, flattening (adjacent or not) and unflattening: meshplan's
rank groups equal torch's wherever torch accepts the operation — the groups torch
lists for each dim (``_layout.remap_to_tensor``), the process groups it actually
creates, the instance holding rank 0 (``mesh.mesh``) and rank 0's coordinate. Where
torch refuses a well-defined operation, meshplan's answer is checked against the
brute-force model instead, and examples below pin it.
"""

import math

import pytest
import torch.distributed as dist
from _layout_model import MeshModel, ModelError
from _torch_oracle import quiet_torch_warnings, torch_groups, torch_instance, torch_mesh
from hypothesis import event, given
from hypothesis import strategies as st

from meshplan.errors import MeshError
from meshplan.layout import Mesh

pytestmark = pytest.mark.usefixtures("fake_world")

TORCH_REFUSALS = (KeyError, ValueError, RuntimeError, AssertionError)


@st.composite
def cases(draw):
    """(shape, names, ranks): rank 0 is always in the mesh (torch slices only around it)."""
    shape = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=4)))
    n = math.prod(shape)
    kind = draw(st.sampled_from(["identity", "permuted", "subset"]))
    if kind == "identity":
        ranks = list(range(n))
    elif kind == "permuted":
        ranks = list(draw(st.permutations(range(n))))
    else:
        others = draw(
            st.lists(st.integers(1, 3 * n + 8), min_size=n - 1, max_size=n - 1, unique=True)
        )
        ranks = list(draw(st.permutations([0, *others])))
    event(f"rank map: {kind}")
    names = tuple("abcd"[: len(shape)])
    return shape, names, ranks


def build(case):
    shape, names, ranks = case
    return (
        Mesh.create(shape, names, ranks),
        torch_mesh(shape, names, ranks),
        MeshModel.create(shape, names, ranks),
    )


def assert_same_groups(ours: Mesh, theirs) -> None:
    """Every per-dim group list, the whole-mesh groups, rank 0's instance and coordinate."""
    assert ours.shape == tuple(theirs.shape)
    for i, name in enumerate(ours.names):
        assert ours.groups(name) == tuple(map(tuple, torch_groups(theirs, [i])))
    assert ours.groups() == tuple(map(tuple, torch_groups(theirs)))
    assert ours.group_of(0) == tuple(torch_instance(theirs))
    assert ours.coordinate(0) == theirs.get_coordinate()
    assert tuple(ours.submesh(at=0).ranks) == tuple(torch_instance(theirs))
    full = theirs._layout.remap_to_tensor(theirs._rank_map)
    for rank in ours.ranks:
        where = (full == rank).nonzero()[0].tolist()
        assert ours.coordinate(rank) == tuple(where[1:])


def assert_same_process_groups(ours: Mesh, theirs) -> None:
    """The process groups torch created hold the ranks of our group (torch sorts them)."""
    for i, name in enumerate(ours.names):
        pg = theirs.get_group(i)
        assert sorted(dist.get_process_group_ranks(pg)) == sorted(ours.group_of(0, name))


def assert_same_as_model(ours: Mesh, model: MeshModel) -> None:
    for name in ours.names + tuple(ours.aliases):
        assert ours.groups(name) == model.groups((name,))
    assert ours.groups() == model.groups()


@given(cases())
def test_root_mesh_groups_equal_torch(case):
    ours, theirs, _ = build(case)
    assert_same_groups(ours, theirs)
    assert_same_process_groups(ours, theirs)


@given(cases(), st.data())
def test_slicing_equals_torch_where_torch_accepts(case, data):
    ours, theirs, model = build(case)
    dims = tuple(data.draw(st.lists(st.sampled_from(ours.names), unique=True, min_size=1)))
    sliced = ours[dims]
    try:
        with quiet_torch_warnings():
            their_slice = theirs[dims]
    except TORCH_REFUSALS:
        event("slice: torch refuses, checked against the model")
        assert list(dims) != sorted(dims)  # torch refuses only out-of-order slices
        assert_same_as_model(sliced, model.slice(dims))
        return
    event("slice: both accept, groups equal")
    assert_same_groups(sliced, their_slice)
    assert_same_process_groups(sliced, their_slice)


@given(cases(), st.data())
def test_flattening_equals_torch_where_torch_accepts(case, data):
    ours, theirs, model = build(case)
    dims = tuple(data.draw(st.lists(st.sampled_from(ours.names), unique=True, min_size=1)))
    index = [ours.names.index(d) for d in dims]
    adjacent = index == list(range(index[0], index[0] + len(index)))
    flat = ours.flatten(dims, "x")
    try:
        with quiet_torch_warnings():
            their_flat = theirs[dims]._flatten("x")
    except TORCH_REFUSALS:
        event("flatten: torch refuses, checked against the model")
        assert list(dims) != sorted(dims)
        assert_same_as_model(flat, model.flatten(dims, "x"))
        return
    event(f"flatten ({'adjacent' if adjacent else 'non-adjacent'}): both accept, groups equal")
    assert_same_groups(flat["x"], their_flat)
    assert_same_process_groups(flat["x"], their_flat)
    # Slice the alias together with other dims, in a random order.
    rest = [n for n in ours.names if n not in dims]
    others = data.draw(st.lists(st.sampled_from(rest), unique=True)) if rest else []
    keys = tuple(data.draw(st.permutations(["x", *others])))
    mixed = flat[keys]
    try:
        with quiet_torch_warnings():
            their_mixed = theirs[keys]
    except TORCH_REFUSALS:
        event("alias + dims slice: torch refuses, checked against the model")
        assert_same_as_model(mixed, model.flatten(dims, "x").slice(keys))
        return
    event("alias + dims slice: both accept, groups equal")
    assert_same_groups(mixed, their_mixed)


def factorization(n):
    divisors = [d for d in range(1, n + 1) if n % d == 0]
    return st.lists(st.sampled_from(divisors), max_size=3).map(lambda ds: _complete(ds, n))


def _complete(ds, n):
    out, rest = [], n
    for d in ds:
        if rest % d == 0:
            out.append(d)
            rest //= d
    return (*out, rest)


@given(cases(), st.data())
def test_unflattening_equals_torch_where_torch_accepts(case, data):
    ours, theirs, model = build(case)
    # Unflatten a dim of the root, of a slice, or of a flattening (adjacent or not).
    route = data.draw(st.sampled_from(["root", "slice", "flatten"]))
    if route == "root":
        mesh, tmesh, mmodel = ours, theirs, model
    else:
        dims = tuple(
            sorted(data.draw(st.lists(st.sampled_from(ours.names), unique=True, min_size=1)))
        )
        if route == "slice":
            mesh, mmodel = ours[dims], model.slice(dims)
            with quiet_torch_warnings():
                tmesh = theirs[dims]
        else:
            mesh, mmodel = ours.flatten(dims, "x")["x"], model.flatten(dims, "x").slice(("x",))
            tmesh = theirs[dims]._flatten("x")
    i = data.draw(st.integers(0, mesh.ndim - 1))
    sizes = data.draw(factorization(mesh.shape[i]))
    names = tuple(f"u{k}" for k in range(len(sizes)))
    try:
        expected = mmodel.unflatten(i, sizes, names)
    except ModelError:
        expected = None
    try:
        split = mesh.unflatten(i, sizes, names)
    except MeshError:
        assert expected is None  # meshplan refuses only what has no layout at all
        split = None
    try:
        their_split = tmesh._unflatten(i, sizes, names)
    except TORCH_REFUSALS:
        their_split = None
    if split is None:
        event(
            f"unflatten ({route}): meshplan refuses (no layout); torch "
            + ("refuses too" if their_split is None else "accepts")
        )
        if their_split is not None:
            # torch returned something; it cannot be the split (the model has none).
            assert expected is None
        return
    assert_same_as_model(split, expected)
    if their_split is None:
        event(f"unflatten ({route}): torch refuses, checked against the model")
        return
    event(f"unflatten ({route}): both accept, groups equal")
    assert_same_groups(split, their_split)
    assert_same_process_groups(split, their_split)


# -- pinned results where torch refuses -------------------------------------------------


def test_out_of_order_slice_is_pinned():
    # torch: KeyError "Mesh dim indices should be in ascending order".
    mesh = Mesh.create((2, 2, 2), ("a", "b", "c"))
    assert mesh["c", "a"].groups() == ((0, 4, 1, 5), (2, 6, 3, 7))
    assert mesh["c", "a"].coordinate(5) == (1, 1)
    theirs = torch_mesh((2, 2, 2), ("a", "b", "c"), range(8))
    with pytest.raises(KeyError, match="ascending"):
        theirs["c", "a"]


def test_alias_before_a_faster_dim_is_pinned():
    # torch refuses mesh["ac", "b"] after flattening non-adjacent a, c.
    mesh = Mesh.create((2, 2, 2), ("a", "b", "c")).flatten(("a", "c"), "ac")
    assert mesh["ac", "b"].groups() == ((0, 2, 1, 3, 4, 6, 5, 7),)
    assert mesh["ac", "b"].coordinate(5) == (3, 0)
    theirs = torch_mesh((2, 2, 2), ("a", "b", "c"), range(8))
    theirs["a", "c"]._flatten("ac")
    with quiet_torch_warnings(), pytest.raises(KeyError):
        theirs["ac", "b"]


def test_size_one_flatten_then_slice_matches_torch():
    # torch #169381: flatten + slice with size-1 dims (fixed in torch 2.13; pinned here).
    names = ("d1", "d2", "d3", "d4")
    mesh = Mesh.create((1, 1, 1, 1), names).flatten(("d2", "d3"), "d23")
    theirs = torch_mesh((1, 1, 1, 1), names, [0])
    theirs["d2", "d3"]._flatten("d23")
    with quiet_torch_warnings():
        their_slice = theirs["d1", "d23", "d4"]
    assert_same_groups(mesh["d1", "d23", "d4"], their_slice)
    names = ("a", "b", "c", "d")
    mesh = Mesh.create((2, 1, 1, 2), names).flatten(("b", "c"), "bc")
    theirs = torch_mesh((2, 1, 1, 2), names, range(4))
    theirs["b", "c"]._flatten("bc")
    with quiet_torch_warnings():
        their_slice = theirs["a", "bc", "d"]
    assert_same_groups(mesh["a", "bc", "d"], their_slice)


def _factorizations(n, k):
    if k == 1:
        yield (n,)
        return
    for d in range(1, n + 1):
        if n % d == 0:
            for rest in _factorizations(n // d, k - 1):
                yield (d, *rest)


@pytest.mark.parametrize("shape", [(3, 2, 4), (2, 3, 3), (2, 2, 3)])
def test_unflattening_non_adjacent_flattenings_agrees_with_torch_exhaustively(shape):
    # Every split of a flattening of a and c: both accept with equal groups, or both refuse.
    names = ("a", "b", "c")
    seen = {"agree": 0, "both refuse": 0}
    for k in (2, 3):
        for sizes in _factorizations(shape[0] * shape[2], k):
            parts = tuple(f"u{i}" for i in range(k))
            ours = Mesh.create(shape, names).flatten(("a", "c"), "x")["x"]
            theirs = torch_mesh(shape, names, range(math.prod(shape)))["a", "c"]._flatten("x")
            try:
                their_split = theirs._unflatten(0, sizes, parts)
            except TORCH_REFUSALS:
                with pytest.raises(MeshError, match="cannot unflatten"):
                    ours.unflatten(0, sizes, parts)
                seen["both refuse"] += 1
                continue
            assert_same_groups(ours.unflatten(0, sizes, parts), their_split)
            seen["agree"] += 1
    assert seen["agree"] and seen["both refuse"]
