"""save on 8 gloo ranks, load on 4 (another mesh, order and StridedShard): the same tensors."""

import os

import torch

from meshplan.layout import Mesh
from meshplan.placement import Replicate, Shard, Spec, StridedShard, shard, unshard

MESH8 = Mesh.create((2, 4), ("dp", "tp"), ranks=[3, 0, 6, 1, 5, 7, 2, 4])  # permuted rank map
MESH4 = Mesh.create((2, 2), ("a", "b"))

SAVED = {
    "w": Spec(MESH8, (Shard(0), Shard(0)), (11, 6), "float32", {0: ("tp", "dp")}),
    "e": Spec(MESH8, (StridedShard(1, 2), Shard(0)), (5, 13), "bfloat16"),
    "b": Spec(MESH8, (Replicate(), Shard(0)), (7,), "int64"),
    "s": Spec(MESH8, (Replicate(), Replicate()), (), "float64"),
}
TARGETS = {
    "w": Spec(MESH4, (Shard(1), StridedShard(0, 3)), (11, 6), "float32"),
    "e": Spec(MESH4, (Shard(1), Shard(1)), (5, 13), "bfloat16", {1: ("b", "a")}),
    "b": Spec(MESH4, (Replicate(), Replicate()), (7,), "int64"),
    "s": Spec(MESH4, (Replicate(), Replicate()), (), "float64"),
}


def _global(key):
    spec = SAVED[key]
    gen = torch.Generator().manual_seed(len(key) * 7 + len(spec.shape))
    return torch.randn(spec.shape, generator=gen, dtype=torch.float64).to(
        getattr(torch, spec.dtype)
    )


def _save(path, bad_rank=None, crash_commit=False):
    import torch.distributed as dist

    from meshplan.checkpoint import CheckpointError, save
    from meshplan.placement import Sharded, shard_one
    from meshplan.runtime._groups import ProcessGroups

    rank = dist.get_rank()
    groups = ProcessGroups(MESH8)
    state = {k: Sharded(shard_one(_global(k), s, rank), s, rank) for k, s in SAVED.items()}
    if rank == bad_rank:
        state.pop("w")  # this rank forgets a tensor: nobody commits, nobody hangs
    import meshplan.checkpoint._protocol as protocol

    real_commit = protocol._commit
    if crash_commit:
        protocol._commit = lambda *a: (_ for _ in ()).throw(OSError("disk gone (simulated)"))
    try:
        meta = save(state, path, groups)
    except (CheckpointError, OSError) as e:
        return ("error", f"{type(e).__name__}: {e}")
    finally:
        protocol._commit = real_commit
    return ("ok", meta)


def _load(path):
    import torch.distributed as dist

    from meshplan.checkpoint import load
    from meshplan.runtime._groups import ProcessGroups

    groups = ProcessGroups(MESH4)
    got = load(path, TARGETS, groups)
    assert all(s.rank == dist.get_rank() for s in got.values())
    return {k: s.local for k, s in got.items()}


def test_save_on_8_ranks_then_load_on_4_gives_the_saved_tensors(pool8, pool4, tmp_path):
    path = str(tmp_path / "ckpt")
    results = pool8.run(_save, path)
    assert all(status == "ok" for status, _ in results)
    metas = [m for _, m in results]
    assert all(m == metas[0] for m in metas)
    # one file per rank that owns a chunk; every rank owns some chunk of "w" here
    assert len(metas[0].files) == 8
    per_rank = pool4.run(_load, path)
    for key, spec in TARGETS.items():
        locals_ = {r: per_rank[r][key] for r in range(4)}
        assert torch.equal(unshard(locals_, spec), _global(key)), key
        want = shard(_global(key), spec)
        assert all(torch.equal(locals_[r], want[r]) for r in range(4)), key


def test_a_failing_rank_aborts_the_save_everywhere_and_keeps_the_old_one(pool8, pool4, tmp_path):
    path = str(tmp_path / "ckpt")
    assert all(s == "ok" for s, _ in pool8.run(_save, path))
    before = sorted(os.listdir(path))
    results = pool8.run(_save, path, bad_rank=5)
    assert all(status == "error" for status, _ in results)
    assert any("'w'" in msg and "cover" in msg for _, msg in results)
    assert set(before) <= set(os.listdir(path))
    per_rank = pool4.run(_load, path)
    for key, spec in TARGETS.items():
        assert torch.equal(unshard({r: per_rank[r][key] for r in range(4)}, spec), _global(key))


def test_a_failed_commit_fails_the_save_on_every_rank(pool8, pool4, tmp_path):
    path = str(tmp_path / "ckpt")
    assert all(s == "ok" for s, _ in pool8.run(_save, path))
    results = pool8.run(_save, path, crash_commit=True)
    assert all(status == "error" for status, _ in results)
    coordinator = MESH8.rank_at((0, 0))  # rank 3 under the permuted rank map
    assert "OSError: disk gone" in results[coordinator][1]
    assert all("commit on rank 3 failed" in m for r, (_, m) in enumerate(results) if r != 3)
    per_rank = pool4.run(_load, path)
    assert torch.equal(unshard({r: per_rank[r]["w"] for r in range(4)}, TARGETS["w"]), _global("w"))


def _save_on_a_stage_then_use_the_world(path):
    # a mesh over ranks 0, 1 of 4 (a pipeline stage): the other ranks call save too, so
    # every rank creates the stage's group, and the world's groups stay in step after it
    import torch.distributed as dist

    from meshplan.checkpoint import save
    from meshplan.placement import Partial, Sharded, shard_one
    from meshplan.redistribute import plan
    from meshplan.runtime import run
    from meshplan.runtime._groups import ProcessGroups

    rank = dist.get_rank()
    stage = Mesh.create((2,), ("tp",), ranks=(0, 1))
    spec = Spec(stage, [Shard(0)], (4,), "float32")
    groups = ProcessGroups(stage, timeout=10.0)
    state = {"w": Sharded(shard_one(torch.arange(4.0), spec, rank), spec, rank)} if rank < 2 else {}
    meta = save(state, path, groups)
    world = Mesh.create((4,), ("w",))
    total = run(
        plan(
            Spec(world, [Partial()], (1,), "float64"), Spec(world, [Replicate()], (1,), "float64")
        ),
        torch.tensor([float(rank)], dtype=torch.float64),
        ProcessGroups(world, timeout=10.0),
    )
    return meta is None, float(total)


def test_ranks_outside_a_stage_mesh_take_part_in_its_save(pool4, tmp_path):
    from meshplan.checkpoint import load_all

    results = pool4.run(_save_on_a_stage_then_use_the_world, str(tmp_path))
    assert results == [(False, 6.0), (False, 6.0), (True, 6.0), (True, 6.0)]
    spec = Spec(Mesh.create((2,), ("tp",)), [Replicate()], (4,), "float32")
    assert torch.equal(load_all(tmp_path, {"w": spec})[0]["w"].local, torch.arange(4.0))
