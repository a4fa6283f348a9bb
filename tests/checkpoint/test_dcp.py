"""torch DCP checkpoints: saved from DTensors on 4 gloo ranks, loaded bit-exact into other
specs, meshes and worlds and into one process; a meshplan checkpoint converted to DCP
loads with dcp.load."""

import os

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate as TR
from torch.distributed.tensor import Shard as TS
from torch.distributed.tensor import distribute_tensor

from meshplan.checkpoint import (
    convert_to_dcp,
    load_dcp,
    load_dcp_all,
    read_dcp_metadata,
    save_all,
)
from meshplan.errors import CheckpointError, MissingTensorError
from meshplan.layout import Mesh
from meshplan.placement import (
    Partial,
    Replicate,
    Shard,
    Sharded,
    Spec,
    StridedShard,
    shard,
    unshard,
)


def _tensors():
    g = torch.Generator().manual_seed(3)
    return {
        "even": torch.randn(8, 4, generator=g),
        "uneven": torch.randn(5, 3, generator=g, dtype=torch.float64),
        "ints": torch.arange(7 * 2, dtype=torch.int64).reshape(7, 2),
        "replicated": torch.randn(3, generator=g),
    }


_SAVED = {
    "even": [TS(0), TS(1)],
    "uneven": [TS(0), TS(0)],
    "ints": [TR(), TS(0)],
    "replicated": [TR(), TR()],
}


def _save_from_dtensors(path):
    dm = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    state = {k: distribute_tensor(x, dm, _SAVED[k]) for k, x in _tensors().items()}
    state["step"] = 7  # a non-tensor entry is left alone
    dcp.save(state, checkpoint_id=path)
    dist.barrier()
    return True


def _load_on_ranks(path):
    """Each rank loads into a 2-D mesh of another order and placements."""
    mesh = Mesh.create((2, 2), ("a", "b"), ranks=[3, 1, 2, 0])
    targets = _targets(mesh)
    got = load_dcp(path, targets, rank=dist.get_rank())
    return {k: s.local for k, s in got.items()}


def _targets(mesh):
    x = _tensors()
    return {
        "even": Spec(mesh, (StridedShard(0, 2), Shard(0)), x["even"].shape),
        "uneven": Spec(mesh, (Shard(1), Shard(0)), x["uneven"].shape, "float64", {0: (1,)}),
        "ints": Spec(mesh, (Shard(0), Shard(0)), x["ints"].shape, "int64", {0: (1, 0)}),
        "replicated": Spec(mesh, (Partial(), Shard(0)), x["replicated"].shape),
    }


@pytest.fixture(scope="module")
def dcp_dir(pool4, tmp_path_factory):
    path = str(tmp_path_factory.mktemp("dcp"))
    assert pool4.run(_save_from_dtensors, path) == [True] * 4
    return path


def test_dcp_metadata_reads_shapes_dtypes_and_chunks(dcp_dir):
    meta = read_dcp_metadata(dcp_dir)
    assert sorted(meta.tensors) == sorted(_SAVED)
    assert meta["uneven"].shape == (5, 3) and meta["uneven"].dtype == "float64"
    assert meta["ints"].dtype == "int64"
    assert len(meta["even"].chunks) == 4


def test_dcp_of_dtensors_loads_bit_exact_on_other_ranks_and_specs(pool4, dcp_dir):
    mesh = Mesh.create((2, 2), ("a", "b"), ranks=[3, 1, 2, 0])
    targets = _targets(mesh)
    per_rank = pool4.run(_load_on_ranks, dcp_dir)
    for key, x in _tensors().items():
        locals_ = {r: per_rank[r][key] for r in range(4)}
        assert torch.equal(unshard(locals_, targets[key]), x), key
        want = shard(x, targets[key])
        if not targets[key].is_partial:
            assert all(torch.equal(locals_[r], want[r]) for r in range(4)), key


@pytest.mark.parametrize("world", [1, 3, 6])
def test_dcp_loads_into_any_world_in_one_process(dcp_dir, world):
    mesh = Mesh.create(world, "x")
    for key, x in _tensors().items():
        for placement in (Shard(0), Replicate(), StridedShard(0, 2)):
            spec = Spec(mesh, (placement,), x.shape, str(x.dtype).removeprefix("torch."))
            got = load_dcp_all(dcp_dir, {key: spec})
            assert torch.equal(unshard({r: got[r][key].local for r in got}, spec), x)


def test_dcp_loads_whole_tensors_into_one_process(dcp_dir):
    one = Mesh.create(1)
    targets = {
        k: Spec(one, (Replicate(),), x.shape, str(x.dtype).removeprefix("torch."))
        for k, x in _tensors().items()
    }
    got = load_dcp(dcp_dir, targets)
    for key, x in _tensors().items():
        assert torch.equal(got[key].local, x)
        assert got[key].local.device.type == "cpu"


def test_dcp_load_refuses_unknown_names_and_wrong_shapes(dcp_dir, tmp_path):
    one = Mesh.create(1)
    with pytest.raises(MissingTensorError, match="even"):
        load_dcp(dcp_dir, {"nope": Spec(one, (Replicate(),), (2,))})
    with pytest.raises(CheckpointError, match=r"\(8, 4\)"):
        load_dcp(dcp_dir, {"even": Spec(one, (Replicate(),), (4, 8))})
    with pytest.raises(CheckpointError, match="not a torch DCP checkpoint"):
        load_dcp(str(tmp_path), {"even": Spec(one, (Replicate(),), (8, 4))})


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_meshplan_checkpoint_converted_to_dcp_loads_with_dcp(tmp_path):
    mesh = Mesh.create((2, 2), ("dp", "tp"))
    specs = {
        "even": Spec(mesh, (Shard(0), Shard(1)), (8, 4)),
        "uneven": Spec(mesh, (StridedShard(0, 2), Shard(0)), (5, 3), "float64"),
        "ints": Spec(mesh, (Replicate(), Shard(0)), (7, 2), "int64"),
        "replicated": Spec(mesh, (Replicate(), Replicate()), (3,)),
    }
    states = {}
    for key, x in _tensors().items():
        for r, local in shard(x, specs[key]).items():
            states.setdefault(r, {})[key] = Sharded(local, specs[key], r)
    save_all(states, str(tmp_path / "mp"))
    convert_to_dcp(str(tmp_path / "mp"), str(tmp_path / "dcp"))
    assert os.path.isfile(tmp_path / "dcp" / ".metadata")
    back = {k: torch.zeros_like(x) for k, x in _tensors().items()}
    dcp.load(back, checkpoint_id=str(tmp_path / "dcp"), no_dist=True)
    for key, x in _tensors().items():
        assert torch.equal(back[key], x), key
    # and it reads back into meshplan through the DCP reader
    got = load_dcp_all(str(tmp_path / "dcp"), specs)
    for key, x in _tensors().items():
        assert torch.equal(unshard({r: got[r][key].local for r in got}, specs[key]), x)
