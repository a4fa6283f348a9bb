"""shard/unshard: the pure reference over all ranks at once."""

from __future__ import annotations

import math

import pytest
import torch
from _placement_model import held_indices
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
    local_shape,
    shard,
    shard_one,
    unshard,
)
from meshplan.testing import meshes, specs

DTYPES = ["float32", "float64", "bfloat16", "float16", "int64", "int32", "uint8", "complex64"]
SPECS = specs(mesh=meshes(max_dims=3, max_side=3, max_rank_offset=2), max_side=11, dtypes=DTYPES)


def _tensor(spec: Spec) -> torch.Tensor:
    n = math.prod(spec.shape)
    dtype = getattr(torch, spec.dtype)
    # small values, exact in every dtype above (no negatives for uint8)
    values = torch.arange(n, dtype=torch.int64) % 200 - 50 * (spec.dtype != "uint8")
    return values.to(dtype).reshape(spec.shape)


@given(SPECS)
def test_unshard_of_shard_is_identity(spec):
    # Partial included: meshplan's canonical split reduces back exactly, in every dtype
    x = _tensor(spec)
    locals_ = shard(x, spec)
    assert set(locals_) == set(spec.mesh.group_of(spec.mesh.rank_at((0,) * spec.mesh.ndim)))
    back = unshard(locals_, spec)
    assert back.dtype == x.dtype and torch.equal(back, x)


@given(SPECS)
def test_local_tensors_hold_what_brute_force_chunking_says(spec):
    x = _tensor(spec)
    for rank, local in shard(x, spec).items():
        assert tuple(local.shape) == local_shape(spec, rank)
        assert local.is_contiguous()
        if spec.is_partial:
            continue
        coord = spec.mesh.coordinate(rank)
        held = held_indices(spec.placements, spec.mesh.shape, spec.shape, coord, spec.shard_order)
        expect = x
        for d, ix in enumerate(held):
            expect = expect.index_select(d, torch.tensor(ix, dtype=torch.long))
        assert torch.equal(expect, local)


@given(SPECS)
def test_shard_one_is_one_entry_of_shard(spec):
    x = _tensor(spec)
    everything = shard(x, spec)
    for rank, local in everything.items():
        assert torch.equal(shard_one(x, spec, rank), local)


@given(SPECS)
def test_shard_never_hands_out_a_view_of_its_input(spec):
    x = _tensor(spec)
    before = x.clone()
    for local in shard(x, spec).values():
        if local.numel():
            local.view(-1)[0] = local.view(-1)[0] + 1
    assert torch.equal(x, before)


_PARTIAL = st.sampled_from(
    [("sum",), ("avg",), ("max",), ("min",), ("sum", "avg"), ("avg", "sum"), ("avg", "avg")]
)


@given(_PARTIAL, st.integers(0, 2**16))
def test_unshard_reduces_partial_values_with_their_op(ops, seed):
    mesh = Mesh.create((2, 3)[: len(ops)] if len(ops) == 2 else (3,))
    spec = Spec(mesh, tuple(Partial(op) for op in ops), (4,), "float64")
    g = torch.Generator().manual_seed(seed)
    values = {r: torch.randn(4, generator=g, dtype=torch.float64) for r in range(mesh.size())}
    stacked = torch.stack([values[r] for r in range(mesh.size())]).reshape(*mesh.shape, 4)
    want = stacked
    for m in reversed(range(mesh.ndim)):  # sum/avg commute; one op kind for max/min
        want = {
            "sum": want.sum(m),
            "avg": want.mean(m),
            "max": want.amax(m),
            "min": want.amin(m),
        }[ops[m]]
    assert torch.allclose(unshard(values, spec), want)


def test_partial_split_keeps_the_value_at_coordinate_zero_of_sum_dims():
    mesh = Mesh.create((2, 2), ("a", "b"))
    x = torch.tensor([3, 5], dtype=torch.int32)
    locals_ = shard(x, Spec(mesh, (Partial("sum"), Partial("avg")), (2,), "int32"))
    assert [locals_[r].tolist() for r in range(4)] == [[3, 5], [3, 5], [0, 0], [0, 0]]
    locals_ = shard(x, Spec(mesh, (Partial("max"), Replicate()), (2,), "int32"))
    assert all(torch.equal(t, x) for t in locals_.values())


def test_avg_of_integers_floors_like_integer_division():
    spec = Spec(Mesh.create(2), (Partial("avg"),), (1,), "int64")
    assert unshard({0: torch.tensor([1]), 1: torch.tensor([4])}, spec).tolist() == [2]
    assert unshard({0: torch.tensor([-1]), 1: torch.tensor([-4])}, spec).tolist() == [-3]


def test_sliced_mesh_shards_over_its_first_instance():
    mesh = Mesh.create((2, 3), ("dp", "tp"))["tp"]
    spec = Spec(mesh, (Shard(0),), (3,), "int64")
    assert sorted(shard(torch.arange(3), spec)) == [0, 1, 2]


def test_errors_name_the_mismatch():
    spec = Spec(Mesh.create(2), (Shard(0),), (4,), "float32")
    with pytest.raises(PlacementError, match=r"shape \(3,\)"):
        shard(torch.zeros(3), spec)
    with pytest.raises(PlacementError, match="dtype float64"):
        shard(torch.zeros(4, dtype=torch.float64), spec)
    with pytest.raises(PlacementError, match=r"missing ranks \[1\]"):
        unshard({0: torch.zeros(2)}, spec)
    with pytest.raises(PlacementError, match=r"rank 1's local tensor has shape \(3,\)"):
        unshard({0: torch.zeros(2), 1: torch.zeros(3)}, spec)
    with pytest.raises(PlacementError, match="not in mesh"):
        shard_one(torch.zeros(4), spec, 7)
    # locals of another dtype than the spec's would make a tensor of that dtype
    with pytest.raises(PlacementError, match="rank 0's local tensor is int32"):
        unshard({0: torch.zeros(2, dtype=torch.int32), 1: torch.zeros(2)}, spec)


@pytest.mark.parametrize("dtype", ["float8_e4m3fn", "float8_e5m2"])
@pytest.mark.parametrize("op", ["sum", "avg", "max", "min"])
def test_float8_partials_unshard_through_a_wider_dtype(dtype, op):
    # 8-bit floats have no arithmetic on CPU: the reduction runs in float64
    kind = getattr(torch, dtype)
    spec = Spec(Mesh.create((2, 2)), (Partial(op), Partial(op)), (3,), dtype)
    parts = {r: torch.tensor([r, -1.0, 0.5 * r]).to(kind) for r in range(4)}
    wide = Spec(spec.mesh, spec.placements, spec.shape, "float64")
    want = unshard({r: t.to(torch.float64) for r, t in parts.items()}, wide).to(kind)
    got = unshard(parts, spec)
    assert got.dtype == kind and torch.equal(got.to(torch.float64), want.to(torch.float64))


def test_shard_works_on_simulated_and_traced_tensors():
    # the no-view check asks the tensors, not their storage (LocalTensorMode and
    # torch.compile tensors have none to ask)
    spec = Spec(Mesh.create(2), (Shard(0),), (4,))
    f = torch.compile(lambda x: shard(x, spec)[1] * 2, backend="eager", fullgraph=True)
    assert torch.equal(f(torch.arange(4.0)), torch.tensor([4.0, 6.0]))


def test_strided_shard_example():
    spec = Spec(Mesh.create(2), (StridedShard(0, 2),), (8,), "int64")
    assert [t.tolist() for t in shard(torch.arange(8), spec).values()] == [
        [0, 1, 4, 5],
        [2, 3, 6, 7],
    ]


@pytest.mark.parametrize("dtype", ["uint8", "int8", "int16", "int32", "int64"])
def test_integer_averages_are_the_floor_of_the_mean_without_wrapping(dtype):
    # regression: the differences from the first part were taken in the dtype itself, so
    # uint8 parts [2] and [0] averaged to 129
    spec = Spec(Mesh.create(2), (Partial("avg"),), (3,), dtype)
    info = torch.iinfo(getattr(torch, dtype))
    low, high = max(info.min, -(2**61)), min(info.max, 2**61)  # int64: differences fit
    a = torch.tensor([2, low, high], dtype=getattr(torch, dtype))
    b = torch.tensor([0, high, high], dtype=getattr(torch, dtype))
    want = [(int(x) + int(y)) // 2 for x, y in zip(a, b, strict=True)]
    assert unshard({0: a, 1: b}, spec).tolist() == want
