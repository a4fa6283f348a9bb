"""Bad arguments to the layout API raise MeshError naming them; numpy ints and 0-d arrays
are taken wherever ints are (regressions: these raised bare TypeError / ValueError /
IndexError / AttributeError, hung on nothing, or answered silently wrong)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from meshplan.errors import MeshError
from meshplan.layout import (
    Axis,
    Mesh,
    MeshLayout,
    coalesce,
    complement,
    compose,
    flatten,
    row_major_strides,
    unflatten,
)
from meshplan.layout._frozen import FrozenMap

M = Mesh.create((2, 3, 4), ("a", "b", "c"))
LAY = MeshLayout.row_major((2, 3))

BAD = {
    "slice step 0": lambda: M[::0],
    "float slice": lambda: M[0:2.0],
    "aliases not a mapping": lambda: Mesh(MeshLayout.row_major((4,)), range(4), ("a",), aliases=5),
    "flatten of None": lambda: flatten(None, ("a",), "x"),
    "unflatten of an int": lambda: unflatten(42, "a", (2,), ("x",)),
    "layout of None": lambda: MeshLayout(None),
    "modes of a dim out of range": lambda: LAY.modes([5]),
    "collapse a dim out of range": lambda: LAY.collapse([5]),
    # silently overlapping before
    "collapse a dim twice": lambda: LAY.collapse([0, 0]),
    "a mode of one number": lambda: Axis.from_modes([(2,)]),
    # silently dropped the 3 before
    "a mode of three numbers": lambda: Axis.from_modes([(2, 1, 3)]),
    "offset of text": lambda: Axis.of(6).offset("x"),
    "offsets from None": lambda: Axis.of(6).offsets(None),
    # wrapped around, or returned 2.5, before
    "offset past the end": lambda: Axis.of((2, 3), (3, 1)).offset(6),
    "negative offset": lambda: Axis.of((2, 3), (3, 1)).offset(-1),
    "fractional offset": lambda: Axis.of(6).offset(2.5),
    "complement of a bad mode": lambda: complement([(2,)], 8),
    "coalesce a bad mode": lambda: coalesce([(2,)]),
    "complement of text": lambda: complement([("a", 1)], 8),
    "compose with None": lambda: compose(None, Axis.of(2)),
    # a non-injective layout before
    "compose beyond the outer layout": lambda: compose(Axis.of(4), Axis.of(8)),
    "frozen map of None": lambda: FrozenMap(None),
    "frozen map of text": lambda: FrozenMap("ab"),
    "frozen map of unorderable keys": lambda: FrozenMap({1j: 1, 2j: 2}),
    # regression: built, then hashing it raised a bare TypeError
    "frozen map of a list value": lambda: FrozenMap({"a": [1]}),
    "row-major strides of a float size": lambda: row_major_strides([2, 1.5]),
    # regression: returned the strides (-1, 1)
    "row-major strides of a negative size": lambda: row_major_strides([2, -1]),
    # the dim order followed the hash seed before
    "names as a set": lambda: Mesh.create((2, 3), names={"x", "y"}),
    "shape as bytes": lambda: Mesh.create(b"\x02"),
    "bool ranks": lambda: Mesh.create(2, ranks=[True, False]),
    "ranks beyond 32 bits": lambda: Mesh.create(2, ranks=[2**40, 2**40 + 1]),
    "flatten no dims": lambda: M.flatten((), "e"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_layout_arguments_raise_mesh_errors(case):
    with pytest.raises(MeshError):
        BAD[case]()


def test_numpy_ints_and_zero_d_arrays_are_taken_as_ints():
    assert Mesh.create(np.array(4)).shape == Mesh.create(torch.tensor(4)).shape == (4,)
    assert M[torch.tensor(0)] == M[0] == M[np.int64(0)]
    assert Axis(np.int64(4), np.int64(1)) == Axis.of(4) == Axis.of(np.int64(4))
    assert complement([(2, 1)], np.int64(8)) == complement([(2, 1)], 8)
    assert LAY.global_ranks(0, np.int64(6)) == LAY.global_ranks(np.array([0]), 6)
    assert M.unflatten("c", (np.int64(2), np.int64(2)), ("x", "y")).shape == (2, 3, 2, 2)
    assert M.rank_at((np.int64(1), 2, 3)) == M.rank_at((1, 2, 3))
    assert MeshLayout.row_major(4) == MeshLayout(Axis.of(4)) == MeshLayout([Axis.of(4)])
    assert Mesh(MeshLayout.row_major((4,)), range(4), ("a",), aliases=None).aliases == {}
