"""save(..., blocking=False) on 4 gloo ranks: it returns once the boxes are copied, the
loop may change its tensors and run its own collectives while the save writes and
commits, and the checkpoint holds the values of the moment it was taken."""

import os
import time

import torch

from meshplan.layout import Mesh
from meshplan.placement import Replicate, Shard, Spec

MESH = Mesh.create((2, 2), ("dp", "tp"), ranks=[2, 0, 3, 1])
SPECS = {
    "w": Spec(MESH, (Shard(0), Shard(1)), (6, 4), "float64"),
    "b": Spec(MESH, (Shard(0), Replicate()), (5,), "float32"),
    "step": Spec(MESH, (Replicate(), Replicate()), (2,), "int64"),
}


def _value(key, version):
    spec = SPECS[key]
    gen = torch.Generator().manual_seed(version * 10 + len(key))
    return (torch.randn(spec.shape, generator=gen, dtype=torch.float64) * 100).to(
        getattr(torch, spec.dtype)
    )


def _state(version):
    import torch.distributed as dist

    from meshplan.placement import Sharded, shard_one

    rank = dist.get_rank()
    return {k: Sharded(shard_one(_value(k, version), s, rank), s, rank) for k, s in SPECS.items()}


def _save_then_train(path):
    """Save version 1 without blocking; then overwrite every tensor in place (version 2)
    and run all_reduces on the loop's own groups while the save goes on."""
    import torch.distributed as dist

    import meshplan.checkpoint._protocol as protocol
    from meshplan.checkpoint import SaveHandle, save
    from meshplan.runtime import ProcessGroups

    groups = ProcessGroups(MESH)
    loop = groups.get(None).pg
    state = _state(1)
    real = protocol.write_rank

    def slow_write(*args, **kwargs):  # the write starts after the loop changed its tensors
        time.sleep(0.3)
        return real(*args, **kwargs)

    protocol.write_rank = slow_write
    try:
        handle = save(state, os.path.join(path, "a"), groups, blocking=False)
        assert isinstance(handle, SaveHandle) and handle.staging_seconds >= 0
        for key, new in _state(2).items():
            state[key].local.copy_(new.local)  # the optimizer step, in place
        total = torch.zeros(1)
        for _ in range(50):  # the next steps' collectives, concurrent with the save's own
            x = torch.ones(1)
            dist.all_reduce(x, group=loop)
            total += x
        meta = handle.wait()
    finally:
        protocol.write_rank = real
    assert handle.done() and handle.seconds >= handle.staging_seconds
    # a second one, then a third that waits for it (one at a time on the checkpoint group)
    second = save(state, os.path.join(path, "b"), groups, blocking=False)
    third = save(_state(3), os.path.join(path, "c"), groups, blocking=False)
    assert second.done()  # the third waited for it: one save at a time per groups
    third.wait()
    return meta, float(total)


def test_an_async_save_holds_the_values_of_the_moment_it_was_taken(pool4, tmp_path):
    from meshplan.checkpoint import load_all, read_metadata
    from meshplan.placement import unshard

    path = str(tmp_path / "ckpt")
    results = pool4.run(_save_then_train, path)
    assert all(total == 4 * 50 for _, total in results)
    metas = [m for m, _ in results]
    assert all(m == metas[0] for m in metas)
    assert read_metadata(os.path.join(path, "a"))["w"].spec == SPECS["w"]
    for where, version in (("a", 1), ("b", 2), ("c", 3)):
        got = load_all(os.path.join(path, where), SPECS)
        for key, spec in SPECS.items():
            whole = unshard({r: s[key].local for r, s in got.items()}, spec)
            assert torch.equal(whole, _value(key, version)), (key, where)


def _failing_async_save(path):
    import torch.distributed as dist

    from meshplan.checkpoint import CheckpointError, save
    from meshplan.runtime import ProcessGroups

    groups = ProcessGroups(MESH)
    save(_state(1), path, groups)  # the checkpoint to keep
    state = _state(2)
    if dist.get_rank() == 3:
        state.pop("w")  # this rank forgets a tensor: the save fails on every rank
    handle = save(state, path, groups, blocking=False)
    try:
        handle.wait()
    except CheckpointError as e:
        return str(e)
    return "ok"


def test_a_failed_async_save_raises_on_every_rank_at_wait_and_keeps_the_old_one(pool4, tmp_path):
    from meshplan.checkpoint import load_all
    from meshplan.placement import unshard

    path = str(tmp_path / "ckpt")
    errors = pool4.run(_failing_async_save, path)
    assert len(errors) == 4, errors
    assert all("tensor 'w': saved chunks cover 18 of 24 elements" in e for e in errors), errors
    got = load_all(path, SPECS)
    whole = unshard({r: s["w"].local for r, s in got.items()}, SPECS["w"])
    assert torch.equal(whole, _value("w", 1))


def test_an_async_save_without_groups_and_a_bad_blocking_flag(tmp_path):
    import pytest

    from meshplan.checkpoint import CheckpointError, load, save
    from meshplan.placement import Sharded

    one = Spec(Mesh.create(1), (Replicate(),), (3,), "int64")
    w = torch.arange(3)
    handle = save({"w": Sharded(w, one, 0)}, tmp_path, blocking=False)
    w.add_(100)
    assert handle.wait()["w"].shape == (3,)
    assert load(tmp_path, {"w": one})["w"].local.tolist() == [0, 1, 2]
    with pytest.raises(CheckpointError, match="blocking must be True or False"):
        save({"w": Sharded(w, one, 0)}, tmp_path, blocking="no")
    bad = save({"w": w}, tmp_path, blocking=False)  # not a Sharded: raised by wait()
    with pytest.raises(CheckpointError, match="not a Sharded"):
        bad.wait()
