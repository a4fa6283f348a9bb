"""The index records each tensor's saved spec (mesh shape, names, rank map, layout,
placements, shard order, dtype, shape), and read_metadata gives it back equal."""

import json
import os

import pytest
import torch
from hypothesis import given, settings

from meshplan.checkpoint import (
    INDEX_NAME,
    CheckpointError,
    Metadata,
    TensorMeta,
    load_all,
    metadata_from_json,
    metadata_to_json,
    read_metadata,
    save_all,
)
from meshplan.checkpoint._spec_json import spec_from_doc, spec_to_doc
from meshplan.layout import Mesh
from meshplan.placement import Replicate, Shard, Sharded, Spec, shard
from meshplan.testing import meshes, specs

_meshes = meshes(max_dims=3, max_side=3, max_rank_offset=5, max_aliases=2)
_specs = specs(mesh=_meshes, max_dims=3, max_side=6, dtypes=("float32", "int64", "bfloat16"))


@settings(max_examples=200, deadline=None)
@given(_specs)
def test_a_spec_round_trips_through_its_json_document(spec):
    doc = json.loads(json.dumps(spec_to_doc(spec)))  # through text, as the index is
    back = spec_from_doc(doc, spec.shape, spec.dtype)
    assert back == spec and back.mesh.ranks == spec.mesh.ranks
    assert back.mesh.aliases == spec.mesh.aliases


def test_a_spec_on_a_sliced_mesh_round_trips_with_the_roots_rank_map():
    root = Mesh.create((2, 4), ("dp", "tp"), ranks=range(8, 16))
    for sub in (root["tp"], root["dp"], root.flatten(("dp", "tp"), "all")["all"]):
        spec = Spec(sub, (Shard(1),), (3, 8), "float64")
        back = spec_from_doc(spec_to_doc(spec), (3, 8), "float64")
        assert back == spec and back.mesh.groups() == sub.groups()


@settings(max_examples=40, deadline=None)
@given(specs(mesh=_meshes, max_dims=2, max_side=5, allow_partial=False, dtypes=("int64",)))
def test_read_metadata_gives_back_the_spec_each_tensor_was_saved_in(tmp_path_factory, spec):
    path = tmp_path_factory.mktemp("ckpt")
    x = torch.arange(spec.numel()).reshape(spec.shape)
    save_all({r: {"x": Sharded(t, spec, r)} for r, t in shard(x, spec).items()}, path)
    saved = read_metadata(path)["x"]
    assert saved.spec == spec and saved.spec.mesh.ranks == spec.mesh.ranks
    assert dict(saved.spec.shard_order) == dict(spec.shard_order)
    # loading in the saved spec gives the saved local tensors back
    got = load_all(path, {"x": saved.spec})
    for r, t in shard(x, spec).items():
        assert torch.equal(got[r]["x"].local, t)


def test_the_index_text_and_str_show_mesh_placements_and_shard_order(tmp_path):
    mesh = Mesh.create((2, 2), ("dp", "tp"), ranks=[3, 1, 2, 0])
    spec = Spec(mesh, (Shard(0), Shard(0)), (8, 4), "float32", {0: ("tp", "dp")})
    x = torch.randn(8, 4)
    save_all({r: {"w": Sharded(t, spec, r)} for r, t in shard(x, spec).items()}, tmp_path)
    doc = json.loads((tmp_path / INDEX_NAME).read_text())["tensors"]["w"]["spec"]
    assert doc["mesh"] == {
        "shape": [2, 2],
        "names": ["dp", "tp"],
        "ranks": [3, 1, 2, 0],
        "layout": [[[2], [2]], [[2], [1]]],
        "device_type": "cpu",
    }
    assert doc["placements"] == ["S(0)", "S(0)"] and doc["shard_order"] == {"0": [1, 0]}
    assert (
        str(read_metadata(tmp_path)) == "w: f32[8,4](S(0)[1,0] S(0)) on (2, 2) (dp, tp), 4 chunks"
    )


def test_an_index_without_specs_still_reads_with_spec_none(tmp_path):
    meta = Metadata({"w": TensorMeta("w", (0,), "int64", ())})
    text = metadata_to_json(meta)
    assert '"spec"' not in text
    back = metadata_from_json(text)
    assert back["w"].spec is None and "spec not recorded" in str(back["w"])


@pytest.mark.parametrize(
    "damage, match",
    [
        (lambda d: d.pop("placements"), "saved spec .* is malformed .*KeyError"),
        (lambda d: d.update(placements=["S(7)"]), "saved spec .* is malformed"),
        (lambda d: d["mesh"].update(shape=[3]), "disagrees with its layout"),
        (lambda d: d["mesh"].update(ranks=[0, 0]), "saved spec .* is malformed"),
        (lambda d: d.update(shard_order="x"), "saved spec .* is malformed"),
    ],
)
def test_a_damaged_saved_spec_is_a_checkpoint_error_naming_it(tmp_path, damage, match):
    spec = Spec(Mesh.create(2, "dp"), (Shard(0),), (4,), "int64")
    save_all(
        {r: {"w": Sharded(t, spec, r)} for r, t in shard(torch.arange(4), spec).items()}, tmp_path
    )
    index = tmp_path / INDEX_NAME
    doc = json.loads(index.read_text())
    damage(doc["tensors"]["w"]["spec"])
    index.write_text(json.dumps(doc))
    with pytest.raises(CheckpointError, match=match):
        read_metadata(tmp_path)


def test_a_saved_spec_must_describe_its_tensor():
    spec = Spec(Mesh.create(2), (Replicate(),), (4,), "int64")
    with pytest.raises(CheckpointError, match="describes another tensor"):
        TensorMeta("w", (5,), "int64", (), spec)
    with pytest.raises(CheckpointError, match="not a meshplan Spec"):
        TensorMeta("w", (4,), "int64", (), "S(0)")


def test_ranks_saving_one_key_in_different_specs_is_an_error_naming_both(tmp_path):
    a = Spec(Mesh.create(2, "dp"), (Shard(0),), (4,), "int64")
    b = Spec(Mesh.create(2, "tp"), (Shard(0),), (4,), "int64")  # same boxes, another mesh
    x = torch.arange(4)
    states = {0: {"w": Sharded(x[:2], a, 0)}, 1: {"w": Sharded(x[2:], b, 1)}}
    with pytest.raises(CheckpointError, match=r"rank 0 saves .* but rank 1 saves .*one spec per"):
        save_all(states, tmp_path)
    assert not os.path.exists(tmp_path / INDEX_NAME)
