"""meshplan.testing strategies refuse bad arguments up front with InvalidArgument naming
the value (never a TypeError, a hang, or a draw that always fails), and take numpy ints
wherever they take ints."""

import signal

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis.errors import InvalidArgument

from meshplan.layout import Mesh
from meshplan.placement import Replicate, Shard, Spec
from meshplan.testing import (
    OpCall,
    mesh_dims,
    meshes,
    op_calls,
    placements,
    shapes,
    specs,
)


@pytest.fixture
def no_hang():
    """Fail (rather than hang) a test that runs for more than 20 seconds."""

    def fail(*_):
        raise TimeoutError("hung")

    old = signal.signal(signal.SIGALRM, fail)
    signal.alarm(20)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


def _examples(strategy, n=5):
    out = []

    @settings(max_examples=n, database=None)
    @given(strategy)
    def collect(value):
        out.append(value)

    collect()
    return out


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"max_side": 2, "max_dims": 10**8}, "max_dims=100000000"),
        ({"max_side": 3, "max_dims": 10**12, "permuted": False}, "max_dims=1000000000000"),
        (
            {"min_side": 10**5, "max_side": 10**6, "min_dims": 4, "max_dims": 4, "permuted": False},
            "max_side=1000000",
        ),
        ({"max_side": 2, "max_dims": 31, "permuted": False}, "more than 2147483647 ranks"),
    ],
)
def test_meshes_larger_than_any_world_are_refused_up_front(no_hang, kwargs, needle):
    with pytest.raises(InvalidArgument, match="more than 2147483647 ranks") as info:
        meshes(**kwargs).validate()
    assert needle in str(info.value)


def test_meshes_up_to_the_largest_world_still_draw(no_hang):
    for mesh in _examples(meshes(max_side=2, max_dims=30, permuted=False)):
        assert mesh.size() <= 2**30
    for mesh in _examples(meshes(max_side=1, max_dims=10**12, permuted=False)):
        assert mesh.size() == 1


@pytest.mark.parametrize(
    ("make", "needle"),
    [
        (lambda: placements(partial_ops=[["sum"]]), "holds ['sum']"),
        (lambda: specs(partial_ops=[["sum"]]), "holds ['sum']"),
        (lambda: placements(partial_ops=[None]), "holds None"),
        (lambda: op_calls(ops=[["mm"]]), "holds ['mm']"),
        (lambda: op_calls(ops=None), "ops=None"),
        (lambda: op_calls(ops="mm"), "ops='mm'"),
        (lambda: op_calls(ops=["mm", "nope"]), "holds 'nope'"),
        (lambda: op_calls(ops=[]), "non-empty"),
        (lambda: op_calls(allow_partial="no"), "allow_partial='no'"),
        (lambda: op_calls(allow_strided=None), "allow_strided=None"),
        (lambda: op_calls(max_side=np.float64(3)), "max_side="),
        (lambda: meshes(max_dims=np.bool_(True)), "max_dims="),
        (lambda: specs(shape=[2, np.int64(-1)]), "side=np.int64(-1) must be >= 0"),
    ],
)
def test_bad_collections_and_flags_raise_invalid_argument(make, needle):
    with pytest.raises(InvalidArgument) as info:
        make().validate()
    assert needle in str(info.value)


def test_op_call_values_refuse_bad_fields():
    spec = Spec(Mesh.create(2), (Shard(0),), (4, 3))
    with pytest.raises(InvalidArgument, match="input_specs=None"):
        OpCall("mm", None)
    with pytest.raises(InvalidArgument, match="holds 3, which is not a Spec"):
        OpCall("mm", [spec, 3])
    with pytest.raises(InvalidArgument, match="op=None"):
        OpCall(None, [spec])
    with pytest.raises(InvalidArgument, match="no \\(name, value\\) pair"):
        OpCall("sum", [spec], [("dim",)])
    call = OpCall("sum", [spec], [["dim", 1]])
    assert call == OpCall("sum", (spec,), (("dim", 1),))
    assert str(call) == "sum(f32[4,3](S(0)), dim=1)"


def test_numpy_ints_are_taken_wherever_ints_are():
    n = np.int64
    for mesh in _examples(
        meshes(
            min_dims=n(1),
            max_dims=n(2),
            min_side=n(1),
            max_side=n(3),
            max_rank_offset=n(2),
            max_aliases=np.int32(1),
        )
    ):
        assert mesh.ndim >= 1 and max(mesh.shape) <= 3
    mesh = Mesh.create((2, 2, 2))
    for dims in _examples(mesh_dims(mesh, min_size=n(1), max_size=np.uint8(2))):
        assert 1 <= len(dims) <= 2
    for p in _examples(placements(ndim=n(1), max_split_factor=n(3), allow_partial=False)):
        assert getattr(p, "dim", 0) == 0 and getattr(p, "split_factor", 2) <= 3
    for spec in _examples(specs(shape=[n(2), np.int32(3)], max_split_factor=n(2))):
        assert spec.shape == (2, 3) and all(type(s) is int for s in spec.shape)
    for shape in _examples(shapes(min_dims=n(1), max_dims=n(2), min_side=n(1), max_side=n(3))):
        assert 1 <= len(shape) <= 2 and all(1 <= s <= 3 for s in shape)
    for call in _examples(op_calls(ops=("mm",), max_side=n(3))):
        assert all(s <= 3 for spec in call.input_specs for s in spec.shape)
    assert _examples(specs(shape=(), mesh=Mesh.create(1)), 1)[0].placements == (Replicate(),)
