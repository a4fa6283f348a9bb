"""Every bad input raises MeshError naming the offending value (and nothing else escapes)."""

import contextlib
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshplan.errors import MeshError, MeshplanError
from meshplan.layout import Axis, Mesh, MeshLayout, complement, compose
from meshplan.testing import meshes

MESH = Mesh.create((2, 3, 4), ("a", "b", "c"))
FLAT = MESH.flatten(("a", "c"), "ac")


def raises(*fragments):
    """``pytest.raises(MeshError)`` whose message holds every fragment verbatim."""
    return pytest.raises(
        MeshError, match="(?s)" + "".join(f"(?=.*{re.escape(f)})" for f in fragments)
    )


def test_mesh_error_is_a_value_error_and_carries_the_value():
    with pytest.raises(ValueError) as info:
        Mesh.create((2, 2), ("a", "a"))
    assert isinstance(info.value, MeshplanError) and info.value.value == ("a", "a")


# -- overlapping layouts ---------------------------------------------------------------


def test_overlapping_layout_is_refused():
    layout = MeshLayout([Axis.of(2, 1), Axis.of(2, 1)])
    with raises("overlaps", str(layout)):
        Mesh(layout, range(4), ("a", "b"))


def test_overlapping_alias_is_refused():
    with raises("'x'", "overlapping", "(2,2):(1,1)"):
        Mesh(MeshLayout.row_major((4,)), range(4), ("a",), {"x": Axis.of((2, 2), (1, 1))})


def test_complement_of_overlapping_modes_is_refused():
    with raises("((2, 1), (2, 1))", "overlap"):
        complement([(2, 1), (2, 1)], 8)
    with raises("((2, 0),)", "stride 0"):
        complement([(2, 0)], 4)


def test_complement_world_must_be_a_multiple():
    with raises("((4, 1),)", "does not divide", "6"):
        complement([(4, 1)], 6)
    with raises("0"):
        complement([(2, 1)], 0)


def test_layout_that_does_not_tile_the_rank_map_is_refused():
    with raises("(2:3, 3:1)", "does not tile", "4 ranks", "multiple of 6"):
        Mesh(MeshLayout.row_major((2, 3)), range(4), ("a", "b"))
    interleaved = MeshLayout([Axis.of(2, 3), Axis.of(3, 2)])  # injective, yet no complement
    with raises("does not tile"):
        Mesh(interleaved, range(12), ("a", "b"))


# -- sizes and rank maps ---------------------------------------------------------------


def test_rank_map_of_wrong_length_is_refused():
    with raises("(0, 1, 2, 3, 4)", "5 ranks", "(2, 3)", "needs 6"):
        Mesh.create((2, 3), ranks=range(5))
    with raises("(0, 1, 2)", "3 ranks", "needs 4"):
        Mesh.create((2, 2), ranks=[0, 1, 2])


def test_rank_map_with_duplicates_is_refused():
    with raises("(0, 3, 2, 3)", "repeats rank 3", "positions 1 and 3"):
        Mesh.create(4, ranks=[0, 3, 2, 3])


def test_long_rank_maps_are_elided_in_messages():
    ranks = [*range(99), 5]
    with pytest.raises(MeshError) as info:
        Mesh.create(100, ranks=ranks)
    assert "repeats rank 5" in str(info.value) and "(100 items)" in str(info.value)
    assert len(str(info.value)) < 300


def test_rank_map_with_negative_or_non_int_ranks_is_refused():
    with raises("-1"):
        Mesh.create(2, ranks=[-1, 0])
    with raises("range(-2, 2)", "-2"):
        Mesh.create(4, ranks=range(-2, 2))
    with raises("[0, 1.5]"):
        Mesh.create(2, ranks=[0, 1.5])
    with raises("'01'"):
        Mesh.create(2, ranks="01")
    with raises("empty"):
        Mesh(MeshLayout.row_major(()), [], ())


@given(
    st.lists(st.integers(-3, 40), min_size=0, max_size=12)
    | st.permutations(range(12))
    | st.integers(1, 9).map(lambda n: list(range(5, 5 + 3 * n, 3))),
    st.sampled_from(["int64", "int32", "uint8", "uint64"]),
    st.booleans(),
)
def test_an_integer_array_is_the_rank_map_its_list_is(ranks, dtype, as_tensor):
    # numpy arrays and torch tensors are checked at C speed: the same map, or the same
    # error, as their list
    import numpy as np
    import torch

    from meshplan.layout._ranks import rank_map

    if dtype.startswith("uint") and any(r < 0 for r in ranks):
        return  # (no such array)
    arr = np.array(ranks, dtype=dtype)
    if as_tensor:
        if dtype in ("uint64",):
            return  # (no such tensor)
        arr = torch.from_numpy(arr)

    def outcome(value):
        try:
            return rank_map(value)
        except MeshError as e:
            return str(e).split(" holds ")[-1].split(" repeats ")[-1]

    want, got = outcome(list(ranks)), outcome(arr)
    assert got == want and type(got) is type(want)
    if not isinstance(want, str):
        assert Mesh.create(len(ranks), ranks=arr) == Mesh.create(len(ranks), ranks=ranks)


def test_an_array_of_bools_or_floats_is_refused():
    import numpy as np

    with raises("True"):
        Mesh.create(2, ranks=np.array([True, False]))
    with raises("0.0"):
        Mesh.create(2, ranks=np.array([0.0, 1.0]))
    with raises("holds array([0, 1]), which is not an int"):
        Mesh.create(4, ranks=np.array([[0, 1], [2, 3]]))


def test_an_unordered_rank_collection_is_refused():
    # regression: a set was taken, and its iteration order became the mesh's rank order
    with raises("unordered set", "sorted(ranks)"):
        Mesh.create(3, ranks={5, 3, 4})
    with raises("unordered frozenset"):
        Mesh.create(2, ranks=frozenset({0, 1}))
    with raises("unordered dict"):
        Mesh.create(2, ranks={0: 1, 1: 0})


def test_bad_shapes_are_refused():
    with raises("(2, 0)", "0"):
        Mesh.create((2, 0))
    with raises("(2, 2.0)", "2.0"):
        Mesh.create((2, 2.0))
    with raises("True"):
        Mesh.create((True, 2))
    with raises("10000000000", "32-bit"):
        Mesh.create((10**10,))
    with raises("device_type", "None"):
        Mesh.create((2,), device_type=None)
    with raises("device_type", "['cuda']"):
        Mesh.create((2,), device_type=["cuda"])


def test_numpy_ints_are_sizes_too():
    import numpy as np

    assert Mesh.create(np.int64(4)) == Mesh.create(4)
    assert Mesh.create((np.int32(2), np.int64(3))) == Mesh.create((2, 3))


def test_names_must_match_the_dims():
    with raises("(2, 3)", "2 dim names", "('a',)"):
        Mesh.create((2, 3), ("a",))
    with raises("''"):
        Mesh.create((2,), ("",))


def test_axis_with_mismatched_or_bad_fields_is_refused():
    with raises("(2, 2)", "(1,)"):
        Axis((2, 2), (1,))
    with raises("(0,)"):
        Axis((0,), (1,))
    with raises("-1"):
        Axis((2,), (-1,))
    with raises("'x'"):
        Axis(("x",), (1,))


# -- names -----------------------------------------------------------------------------


def test_duplicate_dim_names_are_refused():
    with raises("['a']", "('a', 'a')"):
        Mesh.create((2, 2), ("a", "a"))


def test_unknown_dims_are_refused_everywhere():
    for call in (
        lambda: MESH["x"],
        lambda: MESH.group_of(0, "x"),
        lambda: MESH.groups(("a", "x")),
        lambda: MESH.flatten(("x",), "y"),
        lambda: MESH.unflatten("x", (1,), ("y",)),
        lambda: MESH.submesh("x", at=0),
        lambda: MESH.size("x"),
    ):
        with raises("'x'", "('a', 'b', 'c')"):
            call()


def test_dim_indices_out_of_range_are_refused():
    with raises("3", "[-3, 3)"):
        MESH[3]
    with raises("-4"):
        MESH[(0, -4)]


def test_bad_dim_keys_are_refused():
    for key in (1.5, True, None, b"a"):
        with raises(repr(key)):
            MESH[(key,)]


def test_an_alias_is_not_a_dim_to_unflatten():
    with raises("'ac'", "flattened alias", "mesh['ac']"):
        FLAT.unflatten("ac", (2, 4), ("x", "y"))


def test_naming_a_dim_twice_is_refused():
    with raises("('a', 'b', 'a')", "'a' twice"):
        MESH["a", "b", "a"]
    with raises("'a' twice"):
        MESH["a", 0]


# -- aliases ---------------------------------------------------------------------------


def test_alias_named_like_a_dim_is_refused():
    with raises("'b'", "clashes", "another alias name"):
        MESH.flatten(("a", "c"), "b")


def test_alias_name_reused_for_other_dims_is_refused():
    with raises("'ac'", "already flattens", "(2,4):(12,1)", "('a', 'b')"):
        FLAT.flatten(("a", "b"), "ac")
    assert FLAT.flatten(("a", "c"), "ac") is FLAT  # same dims: no-op


def test_alias_clashing_with_a_new_dim_name_is_refused():
    with raises("'ac'", "clashes"):
        FLAT.unflatten("b", (3, 1), ("ac", "d"))
    with raises("'a'", "clashes"):
        Mesh(MeshLayout.row_major((2,)), range(2), ("a",), {"a": Axis.of(2)})


def test_bad_alias_names_are_refused():
    with raises("''"):
        MESH.flatten(("a",), "")
    with raises("3"):
        MESH.flatten(("a",), 3)


# -- unflatten -------------------------------------------------------------------------


def test_unflatten_sizes_that_do_not_multiply_out_are_refused():
    with raises("(2, 3)", "multiply to 6", "'c'", "size 4", "product is 4"):
        MESH.unflatten("c", (2, 3), ("x", "y"))


def test_unflatten_sizes_and_names_must_pair_up():
    with raises("(2, 2)", "('x',)"):
        MESH.unflatten("c", (2, 2), ("x",))
    with raises("(4, 0)", "0"):
        MESH.unflatten("c", (4, 0), ("x", "y"))


def test_unflatten_sizes_that_do_not_split_non_adjacent_modes_are_refused():
    # "ac" flattens dims a (3) and c (4), which are not adjacent: offsets 0..3, 8..11,
    # 16..19. Sizes (2, 6) would need a part with offsets 0, 1, 2, 3, 8, 9: no layout.
    ac = Mesh.create((3, 2, 4), ("a", "b", "c")).flatten(("a", "c"), "ac")["ac"]
    with raises("cannot unflatten", "'ac'", "(2, 6)", "(3, 4)"):
        ac.unflatten("ac", (2, 6), ("x", "y"))


def test_unflatten_may_regroup_the_modes_of_non_adjacent_dims():
    # Pinned: "ac" = a (2) x c (4) splits as (4, 2): x = a with c's high bit, y = c's low bit.
    split = FLAT["ac"].unflatten("ac", (4, 2), ("x", "y"))
    assert split.groups("x") == (
        (0, 2, 12, 14),
        (1, 3, 13, 15),
        (4, 6, 16, 18),
        (5, 7, 17, 19),
        (8, 10, 20, 22),
        (9, 11, 21, 23),
    )
    c = MESH.unflatten("c", (2, 2), ("c1", "c2"))
    assert split.groups("y") == c.groups("c2")
    assert FLAT["ac"].unflatten("ac", (2, 2, 2), ("x", "y", "z")).groups("z") == c.groups("c2")


def test_unflatten_into_duplicate_names_is_refused():
    with raises("duplicate", "'a'"):
        MESH.unflatten("c", (2, 2), ("a", "x"))


# -- slicing orders that cannot be expressed ---------------------------------------------


def test_slicing_an_alias_together_with_its_dims_is_refused():
    with raises("('ac', 'a')", "'ac'", "'a'", "share ranks"):
        FLAT["ac", "a"]
    with raises("share ranks"):
        FLAT.groups(("c", "b", "ac"))
    with raises("share ranks"):
        FLAT.flatten(("ac", "c"), "x")


# -- ranks and coordinates ---------------------------------------------------------------


def test_ranks_outside_the_rank_map_are_refused():
    with raises("99", "range(0, 24)", "pass a rank of the mesh"):
        MESH.group_of(99, "a")
    with raises("99"):
        MESH.submesh("a", at=99)
    with raises("'0'"):
        MESH.group_of("0", "a")
    assert MESH.coordinate(99) is None


def test_coordinates_outside_the_shape_are_refused():
    with raises("(2, 0, 0)", "(2, 3, 4)"):
        MESH.rank_at((2, 0, 0))
    with raises("(0, 0)"):
        MESH.rank_at((0, 0))


def test_compose_refuses_what_is_not_a_layout():
    outer = Axis.of((3, 2), (4, 1))  # offsets 0,1,4,5,8,9
    with raises(str(outer), "not a layout"):
        compose(outer, Axis.of(3, 1))


# -- nothing but MeshError escapes -------------------------------------------------------

junk = st.one_of(
    st.integers(-6, 6),
    st.text(max_size=3),
    st.none(),
    st.floats(allow_nan=False),
    st.booleans(),
    st.lists(st.one_of(st.integers(-6, 6), st.sampled_from("abcdx")), max_size=4).map(tuple),
)


@given(meshes(max_dims=3, max_aliases=1), junk, junk)
def test_bad_arguments_raise_only_mesh_errors(mesh, key, other):
    calls = (
        lambda: mesh[key],
        lambda: mesh.groups(key),
        lambda: mesh.group_of(other, key),
        lambda: mesh.submesh(key, at=other),
        lambda: mesh.flatten(key, other),
        lambda: mesh.unflatten(key, other, ("p",)),
        lambda: mesh.coordinate(other),
        lambda: mesh.rank_at(key),
        lambda: mesh.size(key),
        lambda: mesh.alias_for(key),
        lambda: mesh.contains(other),
        lambda: mesh.dim_index(key),
    )
    for call in calls:
        with contextlib.suppress(MeshError):
            call()
