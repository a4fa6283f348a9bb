"""The shell's NCCL paths, shown on CPUs: group warm-up before a partial exchange, the
device calibrate times on, a worker's GPU binding, checkpoint devices and host copies."""

import pytest
import torch
import torch.distributed as dist

from meshplan.checkpoint import load, load_all, save_all
from meshplan.errors import CheckpointError, RuntimeShellError
from meshplan.layout import Mesh
from meshplan.placement import Replicate, Shard, Sharded, Spec, shard
from meshplan.runtime import _p2p
from meshplan.runtime._calibrate import default_device
from meshplan.runtime._groups import ProcessGroups, _needs_warm_up
from meshplan.runtime._worker import bind_device

# -- tasks (run on every rank) ------------------------------------------------------------


def _warmed_partial_exchange():
    """Groups warmed at creation, then an exchange in which only position 0 sends."""
    mesh = Mesh.create((2, 2), ("a", "b"))
    groups = ProcessGroups(mesh, warm_up=True, timeout=43.0)  # a timeout no other test uses
    g = groups.get("b")
    sends = [(1, torch.tensor([float(dist.get_rank())]))] if g.position == 0 else []
    recvs = [(0, (1,))] if g.position == 1 else []
    got = _p2p.exchange(sends, recvs, g, dtype=torch.float32, device="cpu")
    return [float(t) for t in got], _needs_warm_up(g.pg, None)


# -- tests ----------------------------------------------------------------------------------


def test_warmed_groups_exchange_with_ranks_that_send_nothing(pool4):
    results = pool4.run(_warmed_partial_exchange)
    assert [r[0] for r in results] == [[], [0.0], [], [2.0]]
    assert not any(r[1] for r in results)  # gloo connects on creation: no warm-up by default


def test_calibrate_times_on_the_gpu_of_an_nccl_world_whatever_the_mesh_says():
    assert default_device("cpu", "nccl") == torch.device("cuda")
    assert default_device("cpu", "gloo") == torch.device("cpu")
    assert default_device("cpu", "cpu:gloo,cuda:nccl") == torch.device("cpu")


def test_a_worker_binds_a_gpu_only_on_nccl():
    assert bind_device("gloo", 3) is None
    if torch.cuda.is_available():
        pytest.skip("this machine has GPUs: the cuda tests cover the binding")
    with pytest.raises(RuntimeShellError, match="needs CUDA GPUs"):
        bind_device("nccl", 0)


def _saved(tmp_path):
    spec = Spec(Mesh.create(2), (Shard(0),), (5, 2))
    x = torch.arange(10.0).reshape(5, 2)
    save_all({r: {"x": Sharded(t, spec, r)} for r, t in shard(x, spec).items()}, tmp_path)
    return x


def test_load_places_tensors_on_the_device_asked_for(tmp_path):
    _saved(tmp_path)
    target = {"x": Spec(Mesh.create(1), (Replicate(),), (5, 2))}
    assert load(tmp_path, target)["x"].local.device.type == "cpu"
    assert load(tmp_path, target, device="meta")["x"].local.device.type == "meta"
    assert load_all(tmp_path, target, device="meta")[0]["x"].local.device.type == "meta"
    with pytest.raises(CheckpointError, match="device='nope'"):
        load(tmp_path, target, device="nope")


def test_save_copies_non_contiguous_boxes_to_contiguous_host_tensors(tmp_path):
    from meshplan.checkpoint._write import to_host

    base = torch.arange(12.0).reshape(3, 4)
    pieces = to_host([base.t(), base[:, 1:3], base])
    assert all(p.is_contiguous() and p.device.type == "cpu" for p in pieces)
    assert torch.equal(pieces[0], base.t()) and torch.equal(pieces[1], base[:, 1:3])
    assert pieces[2] is base  # a contiguous CPU tensor is not copied
