"""Laws of the layout algebra (Axis, coalesce, complement, compose), against brute force."""

import itertools
import math

import pytest
from _layout_model import as_layout
from hypothesis import assume, given
from hypothesis import strategies as st

from meshplan.errors import MeshError
from meshplan.layout import Axis, MeshLayout, coalesce, complement, compose
from meshplan.layout._compose import modes_of

modes_lists = st.lists(st.tuples(st.integers(1, 4), st.integers(0, 12)), max_size=4)


def brute_offsets(modes):
    """Offsets of ``modes`` in index order (row-major, last mode fastest)."""
    return tuple(
        sum(c * d for c, (_, d) in zip(coord, modes, strict=True))
        for coord in itertools.product(*(range(s) for s, _ in modes))
    )


def brute_tiling(offsets, world):
    """The set T with offsets ⊕ T == range(world), or None (it is unique when it exists)."""
    covered, tiles = set(), []
    s = set(offsets)
    if len(s) != len(offsets) or max(offsets) >= world:
        return None
    for x in range(world):
        if x in covered:
            continue
        shifted = {x + o for o in s}
        if shifted & covered or max(shifted) >= world:
            return None
        covered |= shifted
        tiles.append(x)
    return tiles


@st.composite
def equivalent_modes(draw, modes):
    """Another mode list with the same offsets: modes split in two, size-1 modes inserted."""
    out = []
    for size, stride in modes:
        if draw(st.booleans()):
            out.append((1, draw(st.integers(0, 9))))
        divisors = [a for a in range(1, size + 1) if size % a == 0]
        a = draw(st.sampled_from(divisors))
        out.extend([(a, stride * (size // a)), (size // a, stride)])
    return out


@given(modes_lists)
def test_coalesce_keeps_offsets(modes):
    assert brute_offsets(coalesce(modes)) == brute_offsets(modes)


@given(modes_lists)
def test_axis_offsets_equal_brute_force(modes):
    axis = Axis.from_modes(modes)
    assert axis.offsets() == brute_offsets(modes)
    assert [axis.offset(i) for i in range(axis.size())] == list(brute_offsets(modes))
    assert axis.size() == math.prod(s for s, _ in modes)
    assert axis.cosize() == max(brute_offsets(modes)) + 1


@given(modes_lists, modes_lists)
def test_layouts_with_different_offsets_differ(a, b):
    x, y = Axis.from_modes(a), Axis.from_modes(b)
    assert (x == y) == (brute_offsets(a) == brute_offsets(b))


@given(modes_lists, st.data())
def test_equivalent_layouts_compare_equal(modes, data):
    # Normalization: equal behaviour (same offsets in the same order) means equal values.
    other = data.draw(equivalent_modes(modes))
    assert brute_offsets(other) == brute_offsets(modes)
    x, y = Axis.from_modes(modes), Axis.from_modes(other)
    assert x == y and hash(x) == hash(y) and str(x) == str(y)
    assert x.modes == as_layout(brute_offsets(modes))


@given(st.lists(st.integers(1, 4), max_size=4))
def test_row_major_axes_coalesce_to_one_mode(sizes):
    axis = Axis.of(sizes)
    n = math.prod(sizes)
    assert axis == Axis.of(n) and axis.offsets() == tuple(range(n))


@given(modes_lists)
def test_is_injective_equals_brute_force(modes):
    offsets = brute_offsets(modes)
    assert Axis.from_modes(modes).is_injective() == (len(set(offsets)) == len(offsets))
    assert MeshLayout([Axis.from_modes([m]) for m in modes]).is_injective() == (
        len(set(offsets)) == len(offsets)
    )


@given(modes_lists, st.integers(1, 64))
def test_complement_exists_exactly_when_brute_force_tiles(modes, world):
    offsets = brute_offsets(modes)
    tiles = brute_tiling(offsets, world)
    if tiles is None:
        with pytest.raises(MeshError):
            complement(modes, world)
        return
    comp = complement(modes, world)
    assert sorted(comp.offsets()) == tiles
    assert list(comp.offsets()) == sorted(comp.offsets())  # row-major: ascending bases
    together = sorted(b + o for b in comp.offsets() for o in offsets)
    assert together == list(range(world))


@given(st.lists(st.integers(1, 4), min_size=1, max_size=4), st.data())
def test_complement_of_mesh_dims_lists_the_other_coordinates(shape, data):
    layout = MeshLayout.row_major(shape)
    dims = data.draw(st.lists(st.sampled_from(range(len(shape))), unique=True))
    n = math.prod(shape)
    groups = layout.global_ranks(dims, n)
    flat = sorted(r for g in groups for r in g)
    assert flat == list(range(n))
    # the same groups from the dims' flattened Axis, and from a lone dim
    assert layout.global_ranks(layout.collapse(dims), n) == groups
    if len(dims) == 1:
        assert layout.global_ranks(dims[0], n) == groups
    # each group: the ranks that agree on every other dim's coordinate
    others = [d for d in range(len(shape)) if d not in dims]
    for g in groups:
        coords = [_coords(r, shape) for r in g]
        assert len({tuple(c[d] for d in others) for c in coords}) == 1


def _coords(rank, shape):
    out = []
    for n in reversed(shape):
        out.append(rank % n)
        rank //= n
    return out[::-1]


@pytest.mark.parametrize("bad", [(2,), -1, (0, 0), "a", 1.5, None, True])
def test_global_ranks_refuses_bad_dims_naming_them(bad):
    with pytest.raises(MeshError, match="mesh dim"):
        MeshLayout.row_major((2, 3)).global_ranks(bad, 6)


@given(modes_lists, st.data())
def test_compose_equals_function_composition(modes, data):
    outer = Axis.from_modes(modes)
    assume(outer.is_injective())  # composition is defined for injective layouts
    n = outer.size()
    size = data.draw(st.sampled_from([d for d in range(1, n + 1) if n % d == 0]))
    stride = data.draw(st.sampled_from([d for d in range(1, n + 1) if n % d == 0]))
    assume((size - 1) * stride < n)
    inner = Axis.of(size, stride)
    expected = tuple(outer.offset(inner.offset(i)) for i in range(size))
    if as_layout(expected) is None:
        with pytest.raises(MeshError):
            compose(outer, inner)
        return
    assert compose(outer, inner) == Axis.from_modes(as_layout(expected))


@given(st.lists(st.integers(1, 4), min_size=1, max_size=4), st.data())
def test_compose_with_row_major_parts_splits_an_axis(sizes, data):
    # Composition with the row-major parts of a factorization recovers the parts.
    n = math.prod(sizes)
    outer = Axis.of(n)
    strides = [math.prod(sizes[i + 1 :]) for i in range(len(sizes))]
    parts = [compose(outer, Axis.of(s, d)) for s, d in zip(sizes, strides, strict=True)]
    assert parts == [Axis.of(s, d) for s, d in zip(sizes, strides, strict=True)]


def test_str_and_repr_read_back():
    axis = Axis.of((2, 2), (4, 1))
    assert str(axis) == "(2,2):(4,1)" and eval(repr(axis)) == axis
    assert str(Axis.of(())) == "1:0" and str(Axis.of(4, 2)) == "4:2"
    layout = MeshLayout.row_major((2, 3))
    assert str(layout) == "(3:3, 3:1)".replace("3:3", "2:3")
    assert eval(repr(layout)) == layout


def test_compose_with_an_interleaved_inner_is_never_wrong():
    # regression: (2,3):(3,2) is injective (offsets 0,2,4,3,5,7) but its modes interleave;
    # composed mode by mode with (2,6):(1,2) it gave (2,3):(6,4), offsets ending in 14 (not
    # even an offset of outer), where the composite 0,4,8,6,10,3 is not a layout
    outer, inner = Axis.of((2, 6), (1, 2)), Axis.of((2, 3), (3, 2))
    with pytest.raises(MeshError, match="not a layout"):
        compose(outer, inner)
    # two-mode outers with sizes that split into several factors, against function composition
    sizes, strides = (2, 3, 4, 6), (1, 2, 3, 4, 6)
    outers = [
        Axis.of(s, d)
        for s in itertools.product(sizes, repeat=2)
        for d in itertools.product(strides, repeat=2)
    ]
    inners = [
        Axis.of(s, d)
        for s in itertools.product((2, 3), repeat=2)
        for d in itertools.product(strides, repeat=2)
    ]
    _compose_agrees_with_function_composition([o for o in outers if o.is_injective()], inners)


def _compose_agrees_with_function_composition(outers, inners):
    for outer in outers:
        for inner in inners:
            if inner.cosize() > outer.size():
                continue
            expected = tuple(outer.offset(inner.offset(i)) for i in range(inner.size()))
            if as_layout(expected) is None:
                with pytest.raises(MeshError, match="not a layout"):
                    compose(outer, inner)
            else:
                assert compose(outer, inner).offsets() == expected, (outer, inner)


def test_interleaved_injective_layout_is_injective_but_does_not_tile():
    modes = ((2, 3), (3, 2))  # offsets 0,2,4,3,5,7: no two alike, yet no complement
    assert Axis.from_modes(modes).is_injective()
    with pytest.raises(MeshError, match="interleave"):
        complement(modes, 12)


@given(modes_lists, modes_lists)
def test_compose_with_any_inner_equals_function_composition(outer_modes, inner_modes):
    outer, inner = Axis.from_modes(outer_modes), Axis.from_modes(inner_modes)
    assume(outer.is_injective() and inner.cosize() <= outer.size())
    expected = tuple(outer.offset(inner.offset(i)) for i in range(inner.size()))
    if as_layout(expected) is None:
        with pytest.raises(MeshError, match="not a layout"):
            compose(outer, inner)
        return
    assert compose(outer, inner) == Axis.from_modes(as_layout(expected))


@given(st.lists(st.integers(0, 12), min_size=1, max_size=12))
def test_modes_of_recovers_layouts(offsets):
    modes = modes_of(offsets)
    assert modes == as_layout(offsets)
    if modes is not None:
        assert Axis.from_modes(modes).offsets() == tuple(offsets)


def test_compose_with_an_inner_that_revisits_offsets_is_never_wrong():
    # regression: (2,2):(1,1) visits offset 1 twice; composed mode by mode with
    # (2,2):(1,2) it gave (2,2):(2,2), offsets 0,2,2,4, where the composite is 0,2,2,1
    outer, inner = Axis.from_modes([(2, 1), (2, 2)]), Axis.from_modes([(2, 1), (2, 1)])
    with pytest.raises(MeshError, match="not a layout"):
        compose(outer, inner)
    # every pair of small one- and two-mode layouts, against function composition
    modes = [(s, d) for s in (1, 2, 3) for d in (0, 1, 2, 3, 4)]
    axes = [Axis.from_modes(m) for k in (1, 2) for m in itertools.product(modes, repeat=k)]
    _compose_agrees_with_function_composition(axes, axes)
