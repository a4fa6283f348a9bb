"""A load with groups checks each saved chunk once, on one of the ranks reading it, and a
corrupt chunk still fails the load on every rank: whichever rank reads it, whoever checks
it, and when the ranks load different targets."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from meshplan.checkpoint import ChunkRecord, TensorMeta
from meshplan.checkpoint._plan import local_boxes, plan_reads, verifiers, writes
from meshplan.layout import Mesh
from meshplan.placement import Shard, Spec
from meshplan.testing import specs

MESH = Mesh.create(4)
SHAPE = (8, 12)
SAVED = Spec(MESH, (Shard(0),), SHAPE, "float32")
ROWS = Spec(MESH, (Shard(1),), SHAPE, "float32")  # every rank reads part of every chunk


def _full():
    return torch.arange(96, dtype=torch.float32).reshape(SHAPE)


def _save(path):
    import torch.distributed as dist

    from meshplan.checkpoint import save
    from meshplan.placement import Sharded, shard_one
    from meshplan.runtime import ProcessGroups

    rank = dist.get_rank()
    state = {
        k: Sharded(shard_one(_full() + i, SAVED, rank), SAVED, rank) for i, k in enumerate("xy")
    }
    save(state, path, ProcessGroups(MESH, timeout=20))


def _load(path, keys_of_rank):
    import torch.distributed as dist

    from meshplan.checkpoint import CheckpointError, load
    from meshplan.placement import shard_one
    from meshplan.runtime import ProcessGroups

    rank = dist.get_rank()
    keys = keys_of_rank.get(rank, "xy")
    try:
        got = load(path, dict.fromkeys(keys, ROWS), ProcessGroups(MESH, timeout=20))
    except CheckpointError as e:
        return ("CheckpointError", str(e))
    ok = all(
        torch.equal(got[k].local, shard_one(_full() + "xy".index(k), ROWS, rank)) for k in keys
    )
    return ("ok", ok)


def _corrupt(path, key, chunk):
    """Flip one byte of ``key``'s saved chunk number ``chunk`` on disk; its file's name."""
    import json
    import struct

    from meshplan.checkpoint import read_metadata

    rec = read_metadata(path)[key].chunks[chunk]
    file = path / rec.file
    data = bytearray(file.read_bytes())
    (n,) = struct.unpack("<Q", data[:8])
    start, _ = json.loads(data[8 : 8 + n])[rec.name]["data_offsets"]
    data[8 + n + start + 5] ^= 0x40
    file.write_bytes(bytes(data))
    return rec


def test_every_chunk_is_checked_once_by_a_rank_that_reads_it():
    saved = TensorMeta(
        "x",
        SHAPE,
        "float32",
        [ChunkRecord((2 * r, 0), (2, 12), "f", f"x#{r}", "") for r in range(4)],
    )
    assert verifiers(saved, ROWS, (0, 1, 2, 3)) == (0, 1, 2, 3)  # shared, not 4 x each


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_the_checker_of_a_chunk_reads_it(data):
    mesh = data.draw(st.sampled_from([Mesh.create(4), Mesh.create((2, 2)), Mesh.create((2, 3))]))
    saved_spec = data.draw(specs(mesh=mesh, min_dims=1, max_dims=2, allow_partial=False))
    target = data.draw(specs(mesh=mesh, shape=saved_spec.shape, allow_partial=False))
    chunks = [
        ChunkRecord(b.chunk.offsets, b.chunk.sizes, "f", f"x#{r}.{i}", "")
        for r in mesh.ranks
        if writes(saved_spec, r)
        for i, b in enumerate(local_boxes(saved_spec, r))
    ]
    saved = TensorMeta("x", saved_spec.shape, saved_spec.dtype, chunks)
    checkers = verifiers(saved, target, tuple(mesh.ranks))
    read_by = {r: {read.chunk for read in plan_reads(saved, target, r)} for r in mesh.ranks}
    for i in range(len(saved.chunks)):
        readers = {r for r, chunks in read_by.items() if i in chunks}
        assert checkers[i] in readers if readers else checkers[i] is None
    if saved.chunks and all(len(c) == len(saved.chunks) for c in read_by.values()):
        # every rank reads every chunk: the greedy split is within one chunk of even
        biggest = max(rec.numel() for rec in saved.chunks)
        load = [
            sum(rec.numel() for rec, c in zip(saved.chunks, checkers, strict=True) if c == r)
            for r in mesh.ranks
        ]
        assert max(load) - min(load) <= biggest


def test_a_corrupt_chunk_fails_the_load_on_every_rank_whoever_checks_it(pool4, tmp_path):
    pool4.run(_save, str(tmp_path))
    assert [g for g in pool4.run(_load, str(tmp_path), {})] == [("ok", True)] * 4
    for chunk in range(4):
        pool4.run(_save, str(tmp_path))
        rec = _corrupt(tmp_path, "y", chunk)
        got = pool4.run(_load, str(tmp_path), {})
        assert [g[0] for g in got] == ["CheckpointError"] * 4, got
        assert all("corrupt" in g[1] and rec.name in g[1] for g in got), got


def test_ranks_loading_different_targets_still_check_every_chunk(pool4, tmp_path):
    # rank 1 loads only "x": the others cannot count on it to check a chunk of "y"
    from meshplan.checkpoint import read_metadata

    pool4.run(_save, str(tmp_path))
    meta = read_metadata(tmp_path)
    checkers = verifiers(meta["y"], ROWS, (0, 1, 2, 3))
    chunk = checkers.index(1)  # the chunk rank 1 would check
    _corrupt(tmp_path, "y", chunk)
    got = pool4.run(_load, str(tmp_path), {1: "x"})
    assert [g[0] for g in got] == ["CheckpointError"] * 4, got
    assert all("corrupt" in g[1] for g in got), got
    pool4.run(_save, str(tmp_path))  # an intact checkpoint loads under those targets
    assert pool4.run(_load, str(tmp_path), {1: "x"}) == [("ok", True)] * 4


def _load_bad_target(path):
    from meshplan.checkpoint import CheckpointError, load
    from meshplan.runtime import ProcessGroups

    wrong = Spec(MESH, (Shard(1),), (8, 12, 1), "float32")
    try:
        load(path, {"x": wrong}, ProcessGroups(MESH, timeout=20))
    except CheckpointError as e:
        return str(e)
    return "loaded"


def test_a_target_of_another_shape_is_named_before_checks_are_shared_out(pool4, tmp_path):
    pool4.run(_save, str(tmp_path))
    for message in pool4.run(_load_bad_target, str(tmp_path)):
        assert "global shape (8, 12)" in message and "(8, 12, 1)" in message, message
