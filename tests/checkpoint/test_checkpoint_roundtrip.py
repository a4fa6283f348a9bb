"""Save under one spec, load under another (any mesh, order, StridedShard): same tensor back."""

import os

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from meshplan.checkpoint import (
    ChunkRecord,
    TensorMeta,
    load,
    load_all,
    local_boxes,
    plan_reads,
    read_metadata,
    save,
    save_all,
    writes,
)
from meshplan.layout import Mesh
from meshplan.placement import DTYPES as ALL_DTYPES
from meshplan.placement import (
    Replicate,
    Shard,
    Sharded,
    Spec,
    StridedShard,
    shard,
    unshard,
)
from meshplan.testing import meshes, shapes, specs

DTYPES = ("float32", "int64", "bfloat16", "bool", "float64")


def _tensor(shape, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randint(-1000, 1000, shape, generator=gen)
    if dtype == "bool":
        return x > 0
    return x.to(getattr(torch, dtype))


def _states(x, spec):
    return {r: {"x": Sharded(t, spec, r)} for r, t in shard(x, spec).items()}


@st.composite
def _save_load_pairs(draw):
    shape = draw(shapes(min_dims=0, max_dims=3, max_side=9), label="shape")
    dtype = draw(st.sampled_from(DTYPES), label="dtype")
    mesh_st = meshes(min_dims=1, max_dims=3, max_side=3)
    src = draw(specs(mesh=mesh_st, shape=shape, dtypes=(dtype,), allow_partial=False), label="src")
    dst = draw(specs(mesh=mesh_st, shape=shape, dtypes=(dtype,)), label="dst")
    return src, dst


def _mkdir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("ckpt"))


@settings(max_examples=60)
@given(pair=_save_load_pairs())
def test_load_under_any_spec_unshards_to_the_saved_tensor(tmp_path_factory, pair):
    src, dst = pair
    x = _tensor(src.shape, src.dtype)
    path = _mkdir(tmp_path_factory)
    save_all(_states(x, src), path)
    got = load_all(path, {"x": dst})
    locals_ = {r: s["x"].local for r, s in got.items()}
    for r, s in got.items():
        assert s["x"].spec == dst and s["x"].rank == r
    assert torch.equal(unshard(locals_, dst), x)
    # each rank's local tensor is exactly what sharding the original gives it
    # (Partial targets: meshplan's canonical split)
    want = shard(x, dst)
    for r, t in locals_.items():
        assert torch.equal(t, want[r]), r


@settings(max_examples=60)
@given(spec=specs(max_dims=3, max_side=9, allow_partial=False))
def test_every_element_is_written_exactly_once(tmp_path_factory, spec):
    x = _tensor(spec.shape, "int64").to(torch.float32)
    spec = Spec(spec.mesh, spec.placements, spec.shape, "float32", spec.shard_order)
    path = _mkdir(tmp_path_factory)
    meta = save_all(_states(x, spec), path)
    count = torch.zeros(spec.shape, dtype=torch.int64)
    for c in meta["x"].chunks:
        count[tuple(slice(o, o + n) for o, n in zip(c.offsets, c.sizes, strict=True))] += 1
    assert bool((count == 1).all())
    # one file per writing rank, no more
    writers = {r for r in shard(x, spec) if writes(spec, r) and local_boxes(spec, r)}
    assert len(meta.files) == len(writers)
    assert sorted(f for f in os.listdir(path) if f.endswith(".safetensors")) == list(meta.files)


@given(src=specs(max_dims=3, max_side=9, allow_partial=False), data=st.data())
def test_plan_reads_fill_each_local_tensor_exactly_once(src, data):
    # pure, no files: the saved chunks are src's owned boxes; every target rank's reads
    # cover its local tensor exactly once and copy the right global elements
    dst = data.draw(
        specs(shape=src.shape, max_side=9, dtypes=("int64",), allow_partial=False), label="dst"
    )
    recs = [
        ChunkRecord(b.chunk.offsets, b.chunk.sizes, f"r{r}", f"x#{i}", "")
        for r in src.mesh.ranks
        if writes(src, r)
        for i, b in enumerate(local_boxes(src, r))
    ]
    meta = TensorMeta("x", src.shape, "int64", recs)
    x = torch.arange(src.numel()).reshape(src.shape)
    for r, want in shard(x, dst).items():
        local = torch.full(want.shape, -1, dtype=torch.int64)
        hits = torch.zeros(want.shape, dtype=torch.int64)
        for read in plan_reads(meta, dst, r):
            rec = recs[read.chunk]
            src_index = tuple(
                slice(ro + o, ro + o + n)
                for ro, o, n in zip(
                    rec.offsets, read.source.offsets, read.source.sizes, strict=True
                )
            )
            dst_index = tuple(
                slice(o, o + n) for o, n in zip(read.target.offsets, read.target.sizes, strict=True)
            )
            local[dst_index] = x[src_index]
            hits[dst_index] += 1
        assert bool((hits == 1).all())
        assert torch.equal(local, want)


def test_save_one_rank_state_of_a_replicated_tensor_then_load_sharded(tmp_path):
    mesh = Mesh.create((2, 2), ("dp", "tp"))
    x = torch.arange(20.0).reshape(4, 5)
    rep = Spec(mesh, (Replicate(), Replicate()), (4, 5))
    save({"w": Sharded(x, rep, 3)}, tmp_path)  # rank 3 is no writer; any replica may save
    got = load(tmp_path, {"w": Spec(mesh, (Shard(1), Shard(1)), (4, 5))}, rank=2)["w"]
    assert torch.equal(got.local, x[:, 3:4])  # dp splits 5 as 3+2, then tp splits 2


def test_load_with_verify_off_reads_only_slices_and_agrees(tmp_path):
    mesh = Mesh.create(4)
    x = torch.randn(9, 6)
    src = Spec(mesh, (Shard(0),), x.shape, "float32")
    save_all(_states(x, src), tmp_path)
    dst = Spec(Mesh.create((2, 2)), (StridedShard(1, 3), Shard(0)), x.shape, "float32", {0: (1,)})
    a = load_all(tmp_path, {"x": dst}, verify=True)
    b = load_all(tmp_path, {"x": dst}, verify=False)
    for r in a:
        assert torch.equal(a[r]["x"].local, b[r]["x"].local)
    assert torch.equal(unshard({r: s["x"].local for r, s in b.items()}, dst), x)


def test_several_keys_on_different_meshes_share_one_checkpoint(tmp_path):
    m8 = Mesh.create((2, 4), ("dp", "tp"))
    m2 = Mesh.create(2, ranks=range(4, 6))
    a = torch.randn(8, 3)
    b = torch.arange(7)
    sa = Spec(m8, (Shard(0), Shard(1)), a.shape)
    sb = Spec(m2, (Shard(0),), b.shape, "int64")
    states = {}
    for r, t in shard(a, sa).items():
        states.setdefault(r, {})["a"] = Sharded(t, sa, r)
    for r, t in shard(b, sb).items():
        states.setdefault(r, {})["b"] = Sharded(t, sb, r)
    meta = save_all(states, tmp_path)
    assert sorted(meta.tensors) == ["a", "b"]
    assert read_metadata(tmp_path) == meta
    one = Mesh.create(1)
    got = load(
        tmp_path,
        {"a": Spec(one, (Replicate(),), a.shape), "b": Spec(one, (Replicate(),), b.shape, "int64")},
    )
    assert torch.equal(got["a"].local, a) and torch.equal(got["b"].local, b)


def test_empty_and_scalar_tensors_round_trip(tmp_path):
    mesh = Mesh.create(3)
    e = torch.zeros(0, 4)
    s = torch.tensor(2.5)
    se = Spec(mesh, (Shard(0),), e.shape)
    ss = Spec(mesh, (Replicate(),), ())
    states = {
        r: {"e": Sharded(shard(e, se)[r], se, r), "s": Sharded(s.clone(), ss, r)} for r in range(3)
    }
    meta = save_all(states, tmp_path)
    assert meta["e"].chunks == () and len(meta["s"].chunks) == 1
    got = load_all(tmp_path, {"e": Spec(Mesh.create(2), (Shard(1),), (0, 4)), "s": ss})
    assert got[1]["e"].local.shape == (0, 2)
    assert all(torch.equal(got[r]["s"].local, s) for r in range(3))


@pytest.mark.parametrize("verify", [True, False])
@pytest.mark.parametrize("dtype", sorted(ALL_DTYPES))
def test_every_dtype_round_trips_bit_exactly(tmp_path, dtype, verify):
    # complex128, which safetensors lacks, is stored as its real view
    x = _tensor((5, 3), "int64").to(torch.float32).to(getattr(torch, dtype))
    src = Spec(Mesh.create(2), (StridedShard(0, 2),), x.shape, dtype)
    save_all(_states(x, src), tmp_path)
    dst = Spec(Mesh.create(3), (Shard(1),), x.shape, dtype)
    got = load_all(tmp_path, {"x": dst}, verify=verify)
    out = unshard({r: s["x"].local for r, s in got.items()}, got[0]["x"].spec)
    assert torch.equal(out.view(torch.uint8), x.view(torch.uint8))


def test_tied_weights_one_tensor_under_two_keys_are_saved(tmp_path):
    # regression: safetensors refuses tensors that share memory
    spec = Spec(Mesh.create(2), (Shard(0),), (4, 3))
    w = _tensor((4, 3), "float32")
    states = {
        r: {"embed": Sharded(t, spec, r), "head": Sharded(t, spec, r)}
        for r, t in shard(w, spec).items()
    }
    save_all(states, tmp_path)
    got = load_all(tmp_path, {"embed": spec, "head": spec})
    for key in ("embed", "head"):
        assert torch.equal(unshard({r: s[key].local for r, s in got.items()}, spec), w)
