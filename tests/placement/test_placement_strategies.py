"""meshplan.testing's placement strategies: valid values, coverage of edge cases, checked args."""

from __future__ import annotations

import pytest
from hypothesis import Phase, given, settings
from hypothesis import find as _find
from hypothesis.errors import InvalidArgument

from meshplan.layout import Mesh
from meshplan.placement import Partial, Shard, Spec, StridedShard
from meshplan.testing import meshes, placements, shapes, specs


@given(specs(mesh=Mesh.create((2, 3)), allow_partial=False, allow_strided=False, allow_order=False))
def test_switches_turn_kinds_off(spec):
    assert not spec.is_partial
    assert not any(isinstance(p, StridedShard) for p in spec.placements)
    assert all(list(o) == sorted(o) for o in spec.shard_order.values())


@given(specs(partial_ops=["max"], dtypes=["int32", "f16"]))
def test_partial_ops_and_dtypes_are_honoured(spec):
    assert {p.op for p in spec.placements if isinstance(p, Partial)} <= {"max"}
    assert spec.dtype in ("int32", "float16")


@given(specs(shape=(5, 0)))
def test_fixed_shape(spec):
    assert spec.shape == (5, 0)


@given(placements(ndim=3, max_split_factor=3))
def test_placements_fit_the_tensor(p):
    assert getattr(p, "dim", 0) in range(3)
    assert getattr(p, "split_factor", 2) in (2, 3)


def find(strategy, condition):
    # generation only: shrinking the example found would cost more than finding it
    fast = settings(max_examples=1000, database=None, phases=[Phase.generate])
    return _find(strategy, condition, settings=fast)


def test_specs_reach_the_interesting_cases():
    find(shapes(), lambda s: 0 in s)
    find(shapes(min_dims=1), lambda s: any(n in (7, 11, 13) for n in s))
    find(specs(), lambda s: any(isinstance(p, StridedShard) for p in s.placements))
    find(
        specs(), lambda s: {p.op for p in s.placements if isinstance(p, Partial)} == {"sum", "avg"}
    )
    find(specs(), lambda s: any(list(o) != sorted(o) for o in s.shard_order.values()))
    find(
        specs(),
        lambda s: any(
            isinstance(p, Shard) and s.shape[p.dim] % s.mesh.shape[m]
            for m, p in enumerate(s.placements)
        ),
    )
    find(specs(mesh=meshes(permuted=True, min_dims=2)), lambda s: isinstance(s, Spec))


@pytest.mark.parametrize(
    "make",
    [
        lambda: shapes(min_dims=3, max_dims=2),
        lambda: shapes(min_side=-1),
        lambda: shapes(max_side=2.5),
        lambda: placements(ndim=-1),
        lambda: placements(allow_partial="yes"),
        lambda: placements(partial_ops=["prod"]),
        lambda: placements(partial_ops=[]),
        lambda: placements(partial_ops="sum"),
        lambda: placements(max_split_factor=1),
        lambda: specs(mesh=(2, 2)),
        lambda: specs(shape=(2, -1)),
        lambda: specs(shape="23"),
        lambda: specs(dtypes=["float7"]),
        lambda: specs(dtypes=[]),
        lambda: specs(allow_order=None),
        lambda: specs(min_side=5, max_side=4),
    ],
)
def test_bad_arguments_raise_invalid_argument(make):
    with pytest.raises(InvalidArgument):
        make().validate()


def test_arguments_are_keyword_only():
    with pytest.raises(TypeError):
        specs(Mesh.create(2))  # type: ignore[misc]
    with pytest.raises(TypeError):
        placements(2)  # type: ignore[misc]
