"""Regressions on 4 gloo ranks: when one rank's load fails (a truncated shard) every rank
raises within seconds instead of entering the next collective alone; background saves on
new ProcessGroups objects do not leak a process group each."""

import os
import time

import torch

from meshplan.layout import Mesh
from meshplan.placement import Shard, Spec

MESH = Mesh.create((2, 2), ("a", "b"))
SPEC = Spec(MESH, (Shard(0), Shard(1)), (4, 6), "float32")


def _state():
    import torch.distributed as dist

    from meshplan.placement import Sharded, shard_one

    rank = dist.get_rank()
    full = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    return {"w": Sharded(shard_one(full, SPEC, rank), SPEC, rank)}


def _save(path):
    from meshplan.checkpoint import save
    from meshplan.runtime import ProcessGroups

    save(_state(), path, ProcessGroups(MESH, timeout=20))


def _load(path):
    import torch.distributed as dist

    from meshplan.checkpoint import CheckpointError, load
    from meshplan.runtime import ProcessGroups

    groups = ProcessGroups(MESH, timeout=20)
    t0 = time.perf_counter()
    try:
        load(path, {"w": SPEC}, groups)
    except CheckpointError as e:
        return ("CheckpointError", str(e), time.perf_counter() - t0)
    # the next collective: the rank whose load failed never comes
    x = torch.ones(1)
    try:
        dist.all_reduce(x, group=groups.get(None).pg)
    except RuntimeError as e:
        return ("hang", str(e).splitlines()[0], time.perf_counter() - t0)
    return ("ok", "", time.perf_counter() - t0)


def test_a_truncated_shard_fails_the_load_on_every_rank_within_seconds(pool4, tmp_path):
    from meshplan.checkpoint import read_metadata

    pool4.run(_save, str(tmp_path))
    victim = tmp_path / read_metadata(tmp_path).files[3]
    victim.write_bytes(victim.read_bytes()[:-5])
    got = pool4.run(_load, str(tmp_path))
    assert [g[0] for g in got] == ["CheckpointError"] * 4, got
    assert all("truncated" in g[1] for g in got), got
    assert len({g[1].split(": ", 1)[-1] for g in got}) <= 2, got  # one message, quoted
    assert max(g[2] for g in got) < 15, got


def _async_saves(path, n):
    from meshplan.checkpoint import save
    from meshplan.runtime import ProcessGroups

    counts = []
    for i in range(n):
        groups = ProcessGroups(MESH, timeout=20)
        save(_state(), os.path.join(path, str(i)), groups, blocking=False).wait()
        del groups
        counts.append(len(os.listdir("/proc/self/fd")))
    return counts


def test_background_saves_on_new_process_groups_do_not_leak_a_group_each(pool4, tmp_path):
    got = pool4.run(_async_saves, str(tmp_path), 5)
    for counts in got:
        assert counts[-1] - counts[0] <= 1, got  # was +2 to +5 descriptors per save


def _save_with_a_full_disk(path):
    import errno

    import torch.distributed as dist

    import meshplan.checkpoint._write as write
    from meshplan.checkpoint import CheckpointError, save
    from meshplan.runtime import ProcessGroups

    real = write.write_safetensors

    def full(tensors, tmp, metadata, *seeds):
        with open(tmp, "wb") as f:
            f.write(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    if dist.get_rank() == 2:
        write.write_safetensors = full
    try:
        save(_state(), path, ProcessGroups(MESH, timeout=20))
    except CheckpointError as e:
        return str(e)
    finally:
        write.write_safetensors = real
    return "saved"


def test_a_distributed_save_failing_on_one_rank_removes_every_ranks_files(pool4, tmp_path):
    from meshplan.checkpoint import INDEX_NAME, read_metadata

    pool4.run(_save, str(tmp_path))
    before = sorted(os.listdir(tmp_path))
    got = pool4.run(_save_with_a_full_disk, str(tmp_path))
    assert all("No space left" in g for g in got), got
    assert sorted(os.listdir(tmp_path)) == before  # no shard file of the failed save
    staged = set(os.listdir(tmp_path / ".meshplan")) - {"commit.lock"}
    assert not staged, staged
    assert INDEX_NAME in before and len(read_metadata(tmp_path).files) == 4
