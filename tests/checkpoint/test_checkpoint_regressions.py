"""Pinned answers where torch 2.13's DCP goes wrong: non-contiguous local shards
(StridedShard) and non-default shard orders. DCP saves each local shard as one box at
its first offset (so a StridedShard shard lands on the wrong rows) and ignores shard
order (so an order-[1,0] layout comes back permuted); meshplan saves box by box."""

import torch

from meshplan.checkpoint import load, load_all, read_metadata, save_all
from meshplan.layout import Mesh
from meshplan.placement import Replicate, Shard, Sharded, Spec, StridedShard, shard


def _save(x, spec, path):
    return save_all({r: {"x": Sharded(t, spec, r)} for r, t in shard(x, spec).items()}, path)


def test_strided_shard_local_tensors_are_saved_as_their_separate_boxes(tmp_path):
    x = torch.arange(8)
    spec = Spec(Mesh.create(2), (StridedShard(0, 2),), (8,), "int64")
    assert torch.equal(shard(x, spec)[0], torch.tensor([0, 1, 4, 5]))
    meta = _save(x, spec, tmp_path)
    boxes = sorted((c.offsets, c.sizes) for c in meta["x"].chunks)
    assert boxes == [((0,), (2,)), ((2,), (2,)), ((4,), (2,)), ((6,), (2,))]
    plain = Spec(Mesh.create(2), (Shard(0),), (8,), "int64")
    got = load_all(tmp_path, {"x": plain})
    assert got[0]["x"].local.tolist() == [0, 1, 2, 3]
    assert got[1]["x"].local.tolist() == [4, 5, 6, 7]
    # and back into the strided layout on another world size
    strided3 = Spec(Mesh.create(3), (StridedShard(0, 2),), (8,), "int64")
    got = load_all(tmp_path, {"x": strided3})
    assert [got[r]["x"].local.tolist() for r in range(3)] == [
        [0, 1, 4, 5],
        [2, 3, 6, 7],
        [],
    ]


def test_uneven_shard_order_is_saved_where_each_rank_really_holds_it(tmp_path):
    # 7 rows sharded by tp first, then dp: tp splits 4+3, dp splits those 2+2 and 2+1
    mesh = Mesh.create((2, 2), ("dp", "tp"))
    spec = Spec(mesh, (Shard(0), Shard(0)), (7, 2), "int64", {0: ("tp", "dp")})
    x = torch.arange(14).reshape(7, 2)
    rows = {r: shard(x, spec)[r][:, 0].div(2, rounding_mode="floor").tolist() for r in range(4)}
    assert rows == {0: [0, 1], 1: [4, 5], 2: [2, 3], 3: [6]}
    meta = _save(x, spec, tmp_path)
    assert sorted(c.offsets[0] for c in meta["x"].chunks) == [0, 2, 4, 6]
    whole = load(tmp_path, {"x": Spec(Mesh.create(1), (Replicate(),), (7, 2), "int64")})
    assert torch.equal(whole["x"].local, x)
    # the default order on the same mesh holds other rows: loading reshards, never permutes
    default = Spec(mesh, (Shard(0), Shard(0)), (7, 2), "int64")
    got = load_all(tmp_path, {"x": default})
    assert got[1]["x"].local[:, 0].div(2, rounding_mode="floor").tolist() == [2, 3]


def test_strided_shard_with_uneven_order_has_several_boxes_per_rank(tmp_path):
    mesh = Mesh.create((2, 3))
    spec = Spec(mesh, (StridedShard(0, 2), Shard(0)), (10, 3), "float32", {0: (1, 0)})
    x = torch.randn(10, 3)
    _save(x, spec, tmp_path)
    counts = {}
    for c in read_metadata(tmp_path)["x"].chunks:
        counts[c.file] = counts.get(c.file, 0) + 1
    assert max(counts.values()) > 1
    got = load_all(tmp_path, {"x": spec})
    want = shard(x, spec)
    assert all(torch.equal(got[r]["x"].local, want[r]) for r in want)
