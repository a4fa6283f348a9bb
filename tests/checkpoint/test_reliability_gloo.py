"""Regression: a distributed save whose peer dies raises a CheckpointError on every survivor,
whose ``committed`` says what is on disk (the new checkpoint, or the previous one kept); a
survivor whose collectives all finished returns normally, and then the commit is on disk."""

import os

import pytest
import torch

from meshplan.checkpoint import CheckpointError, load_all, read_metadata
from meshplan.layout import Mesh
from meshplan.placement import Shard, Spec

MESH = Mesh.create((2, 2), ("a", "b"))
SPEC = Spec(MESH, (Shard(0), Shard(1)), (4, 6), "float32")


def _save(path, value, die_rank=None, die_at=None):
    import torch.distributed as dist

    import meshplan.checkpoint._protocol as protocol
    from meshplan.checkpoint import save
    from meshplan.placement import Sharded, shard_one
    from meshplan.runtime import ProcessGroups

    rank = dist.get_rank()
    groups = ProcessGroups(MESH, timeout=4)  # a dead peer fails collectives within 4 s
    if rank == die_rank:
        name = {"write": "write_rank", "assemble": "_assemble", "commit": "_commit"}[die_at]
        real = getattr(protocol, name)

        def die(*args, **kwargs):
            if die_at == "commit":
                real(*args, **kwargs)  # the new checkpoint is committed, then the rank dies
            os._exit(9)

        setattr(protocol, name, die)
    local = shard_one(torch.full(SPEC.shape, float(value)), SPEC, rank)
    try:
        save({"w": Sharded(local, SPEC, rank)}, path, groups)
    except CheckpointError as e:
        return ("CheckpointError", getattr(e, "committed", "missing"), str(e))
    except Exception as e:  # what the test must not see
        return (type(e).__name__, None, str(e))
    return ("ok", True, "")


def _on_disk(path):
    got = load_all(path, {"w": SPEC})
    return float(got[0]["w"].local.flatten()[0])


@pytest.mark.parametrize(
    ("die_rank", "die_at", "committed"),
    [(2, "write", False), (3, "assemble", None), (1, "assemble", None), (0, "commit", True)],
)
def test_a_peer_dying_mid_save_gives_every_survivor_a_checkpoint_error_that_agrees_with_disk(
    pool4, tmp_path, die_rank, die_at, committed
):
    assert pool4.run(_save, str(tmp_path), 1.0) == [("ok", True, "")] * 4
    outcomes = pool4.run(_save, str(tmp_path), 2.0, die_rank, die_at, return_exceptions=True)
    now = _on_disk(tmp_path)  # loadable and verified, whatever happened
    assert now in (1.0, 2.0)
    on_disk = now == 2.0
    if committed is not None:
        assert on_disk == committed
    for rank, out in enumerate(outcomes):
        if rank == die_rank:
            continue
        kind, said, text = out
        if kind == "ok":  # its collectives all finished: the commit reached it
            assert on_disk, (rank, out)
            continue
        assert kind == "CheckpointError", (rank, out)
        assert said is on_disk, (rank, out, on_disk)
        assert ("IS committed" in text) == on_disk, text
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]
    assert set(read_metadata(tmp_path).files) <= set(os.listdir(tmp_path))
