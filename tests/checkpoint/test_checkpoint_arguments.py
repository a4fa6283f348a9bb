"""Bad arguments and damaged indexes raise CheckpointErrors naming the value and the fix
(never a bare TypeError/ValueError/KeyError/AttributeError/RecursionError/
UnicodeDecodeError/OSError); numpy ints are accepted wherever ints are."""

import json
import os
import re

import numpy as np
import pytest
import torch

from meshplan.checkpoint import (
    INDEX_NAME,
    CheckpointError,
    ChunkRecord,
    Metadata,
    MissingTensorError,
    TensorMeta,
    checksum,
    intersect,
    load,
    load_all,
    local_boxes,
    metadata_from_json,
    metadata_to_json,
    plan_reads,
    read_metadata,
    save,
    save_all,
    writes,
)
from meshplan.layout import Mesh
from meshplan.placement import Chunk, Replicate, Shard, Sharded, Spec, shard

SPEC = Spec(Mesh.create(2), (Shard(0),), (4,), "float32")
ONE = Spec(Mesh.create(1), (Replicate(),), (4,), "float32")


def _states(spec=SPEC, device="cpu"):
    parts = shard(torch.arange(4.0), spec).items()
    return {r: {"w": Sharded(t.to(device), spec, r)} for r, t in parts}


@pytest.fixture
def saved(tmp_path):
    save_all(_states(), tmp_path)
    return tmp_path


# -- paths --------------------------------------------------------------------------------

BAD_PATHS = [("", "empty"), (None, "NoneType None"), (3, "int 3"), ([b"x"], "list")]


@pytest.mark.parametrize(("path", "needle"), BAD_PATHS)
def test_a_bad_path_is_refused_naming_it(path, needle):
    calls = [
        lambda: save_all(_states(), path),
        lambda: save(_states(ONE)[0], path),
        lambda: read_metadata(path),
        lambda: load(path, {"w": SPEC}, rank=0),
        lambda: load_all(path, {"w": SPEC}),
    ]
    for call in calls:
        with pytest.raises(CheckpointError, match="path") as info:
            call()
        assert needle in str(info.value)


def test_a_path_naming_a_file_is_refused_and_the_file_kept(saved):
    index = os.path.join(saved, INDEX_NAME)
    with open(index, "rb") as f:
        before = f.read()
    with pytest.raises(CheckpointError, match="is a file, not a directory"):
        save_all(_states(), index)
    with pytest.raises(CheckpointError, match="cannot read"):
        read_metadata(index)
    with open(index, "rb") as f:
        assert f.read() == before


def test_bytes_and_pathlike_paths_name_the_same_checkpoint(saved):
    assert read_metadata(os.fsencode(saved)) == read_metadata(saved) == read_metadata(str(saved))
    other = os.fsencode(saved / "again")
    save_all(_states(), other)
    assert sorted(os.listdir(os.fsdecode(other))) == sorted(
        (*read_metadata(other).files, INDEX_NAME, ".meshplan")
    )
    got = load_all(other, {"w": ONE})
    assert torch.equal(got[0]["w"].local, torch.arange(4.0))


# -- values that hold no data -----------------------------------------------------------


def test_a_meta_device_tensor_is_refused_before_writing(tmp_path):
    with pytest.raises(CheckpointError, match=r"state\['w'\] is a meta-device tensor"):
        save_all(_states(device="meta"), tmp_path)
    assert os.listdir(tmp_path) == []
    with pytest.raises(CheckpointError, match="meta-device"):
        checksum(torch.zeros(2, device="meta"))


def test_checksum_of_a_non_tensor_is_refused_naming_its_type():
    with pytest.raises(CheckpointError, match="ndarray.*torch.from_numpy"):
        checksum(np.zeros(3))


# -- damaged index text ------------------------------------------------------------------


def _rewrite(path, fn):
    index = os.path.join(path, INDEX_NAME)
    with open(index) as f:
        doc = json.load(f)
    fn(doc)
    with open(index, "w") as f:
        json.dump(doc, f)


def test_an_index_that_is_not_utf8_is_refused(saved):
    with open(os.path.join(saved, INDEX_NAME), "wb") as f:
        f.write(b'{"format": "\xff\xfe"}')
    with pytest.raises(CheckpointError, match="not UTF-8"):
        read_metadata(saved)


def test_a_deeply_nested_index_is_refused(saved):
    with open(os.path.join(saved, INDEX_NAME), "w") as f:
        f.write("[" * 100_000)
    with pytest.raises(CheckpointError, match="nests too deeply"):
        read_metadata(saved)
    with pytest.raises(CheckpointError, match="nests too deeply"):
        metadata_from_json("[" * 100_000)


@pytest.mark.parametrize("text", [None, 3, ["{}"]])
def test_index_text_that_is_no_string_is_refused(text):
    with pytest.raises(CheckpointError, match="must be a str or bytes"):
        metadata_from_json(text)


@pytest.mark.parametrize("version", [True, 1.0, "1", None])
def test_an_index_version_that_is_not_the_int_1_is_refused(saved, version):
    _rewrite(saved, lambda doc: doc.update(version=version))
    with pytest.raises(CheckpointError, match=f"index version {version!r}"):
        read_metadata(saved)


@pytest.mark.parametrize("shape", [[0, -1], [-4], [4.0], [2**63]])
def test_an_index_shape_with_a_bad_side_is_refused(saved, shape):
    def edit(doc):
        doc["tensors"]["v"] = {"shape": shape, "dtype": "float32", "chunks": []}

    _rewrite(saved, edit)
    with pytest.raises(CheckpointError, match=r"malformed at tensor 'v'.*shape") as info:
        read_metadata(saved)
    assert repr(shape[-1]) in str(info.value)


def test_an_index_whose_tensors_are_no_object_is_refused():
    doc = json.loads(metadata_to_json(Metadata({})))
    doc["tensors"] = []
    with pytest.raises(CheckpointError, match="'tensors' is \\[\\]"):
        metadata_from_json(json.dumps(doc))


# -- values --------------------------------------------------------------------------------


def test_records_refuse_non_int_boxes_with_checkpoint_errors():
    with pytest.raises(CheckpointError, match=r"offsets \[0.5\] holds 0.5"):
        ChunkRecord((0.5,), (1,), "f", "n", "c")
    with pytest.raises(CheckpointError, match="holds True"):
        ChunkRecord((0,), (True,), "f", "n", "c")
    with pytest.raises(CheckpointError, match="shape 4 is not a sequence"):
        TensorMeta("w", 4, "float32", ())
    with pytest.raises(CheckpointError, match="not a ChunkRecord"):
        TensorMeta("w", (4,), "float32", [None])


@pytest.mark.parametrize(
    ("fields", "needle"),
    [
        (dict(file=None), "chunk file None is no string"),
        (dict(name=3), "chunk name 3 is no string"),
        (dict(checksum=b"crc32:00000000"), "chunk checksum b'crc32:00000000' is no string"),
    ],
)
def test_chunk_records_take_only_strings_for_file_name_and_checksum(fields, needle):
    args = dict(offsets=(0,), sizes=(4,), file="f.safetensors", name="w#0", checksum="crc32:0")
    with pytest.raises(CheckpointError, match=re.escape(needle)):
        ChunkRecord(**{**args, **fields})


@pytest.mark.parametrize(
    ("fields", "needle"),
    [
        (dict(key=3), "tensor key 3 is no string"),
        (dict(dtype=torch.float32), "dtype torch.float32 is no string"),
        (dict(dtype="float99"), "unknown dtype 'float99'"),
    ],
)
def test_tensor_metas_take_a_string_key_and_a_known_dtype_name(fields, needle):
    with pytest.raises(CheckpointError, match=re.escape(needle)):
        TensorMeta(**{**dict(key="w", shape=(4,), dtype="float32", chunks=()), **fields})


def test_an_index_with_an_unknown_dtype_is_refused_naming_it(saved):
    index = os.path.join(saved, INDEX_NAME)
    with open(index) as f:
        doc = json.load(f)
    doc["tensors"]["w"]["dtype"] = "float99"
    with pytest.raises(CheckpointError, match="malformed at tensor 'w' .*unknown dtype 'float99'"):
        metadata_from_json(json.dumps(doc))


def test_numpy_ints_are_plain_ints_in_records():
    meta = TensorMeta("w", (np.int64(4),), "float32", ())
    assert meta == TensorMeta("w", (4,), "float32", ())
    assert type(meta.shape[0]) is int
    rec = ChunkRecord(np.array([0, 1]), [np.int32(4), 2], "f", "w#0", "")
    assert rec == ChunkRecord((0, 1), (4, 2), "f", "w#0", "")
    assert metadata_to_json(Metadata({"w": meta}))  # json can write it


def test_a_missing_key_names_what_the_checkpoint_holds_and_is_a_key_error(saved):
    meta = read_metadata(saved)
    with pytest.raises(MissingTensorError, match=r"tensor 'nope' is not in .*\['w'\]") as info:
        meta["nope"]
    assert isinstance(info.value, CheckpointError) and isinstance(info.value, KeyError)
    assert str(info.value).startswith("tensor 'nope'")  # not KeyError's quoted form
    with pytest.raises(KeyError):
        meta[["unhashable"]]
    assert meta.tensors.get("nope") is None
    with pytest.raises(MissingTensorError, match="'v' is not in the checkpoint at"):
        load_all(saved, {"v": SPEC})


# -- shell arguments ----------------------------------------------------------------------


def test_groups_that_are_no_process_groups_are_refused(saved, tmp_path):
    with pytest.raises(CheckpointError, match="groups='x' must be a .*ProcessGroups"):
        save(_states(ONE)[0], tmp_path / "new", groups="x")
    assert not os.path.exists(tmp_path / "new")
    with pytest.raises(CheckpointError, match="groups='x' must be a .*ProcessGroups"):
        load(saved, {"w": SPEC}, groups="x")


def test_load_takes_numpy_int_ranks_and_refuses_others(saved):
    got = load(saved, {"w": SPEC}, rank=np.int64(1))
    assert torch.equal(got["w"].local, torch.tensor([2.0, 3.0]))
    for rank in ("1", True, 1.0):
        with pytest.raises(CheckpointError, match=f"rank={rank!r} must be an int"):
            load(saved, {"w": SPEC}, rank=rank)


@pytest.mark.parametrize("verify", [1, "no", None, [True]])
def test_verify_takes_only_true_or_false(saved, verify):
    with pytest.raises(
        CheckpointError, match=re.escape(f"verify must be True or False, got {verify!r}")
    ):
        load(saved, {"w": SPEC}, rank=0, verify=verify)
    with pytest.raises(CheckpointError, match="verify must be True or False"):
        load_all(saved, {"w": SPEC}, verify=verify)


def test_verify_takes_numpy_bools(saved):
    for flag in (np.bool_(False), np.array(True)):
        got = load(saved, {"w": SPEC}, rank=1, verify=flag)
        assert torch.equal(got["w"].local, torch.tensor([2.0, 3.0]))
        assert torch.equal(
            load_all(saved, {"w": SPEC}, verify=flag)[0]["w"].local, torch.arange(2.0)
        )


# -- planning helpers ---------------------------------------------------------------------


def test_intersect_refuses_boxes_of_different_ranks_or_non_boxes():
    with pytest.raises(CheckpointError, match="cannot intersect"):
        intersect(Chunk((0,), (2,)), Chunk((0, 0), (2, 2)))
    with pytest.raises(CheckpointError, match="two Chunks, got None"):
        intersect(Chunk((0,), (2,)), None)


def test_rank_arguments_are_ints_of_the_mesh():
    assert local_boxes(SPEC, np.int64(1)) == local_boxes(SPEC, 1)
    assert writes(SPEC, np.int32(1)) is True
    with pytest.raises(CheckpointError, match=r"rank \[0\] must be an int"):
        local_boxes(SPEC, [0])
    with pytest.raises(CheckpointError, match="rank True must be an int"):
        writes(SPEC, True)
    with pytest.raises(CheckpointError, match="rank 5 is not in the mesh"):
        local_boxes(SPEC, 5)
    with pytest.raises(CheckpointError, match="expected a meshplan.placement.Spec"):
        local_boxes(None, 0)


def test_plan_reads_refuses_a_missing_meta_and_a_spec_of_another_shape():
    saved = TensorMeta("w", (4, 3), "float32", [ChunkRecord((0, 0), (4, 3), "f", "w#0", "")])
    with pytest.raises(CheckpointError, match="needs the saved tensor's TensorMeta"):
        plan_reads(None, SPEC, 0)
    other = Spec(Mesh.create(2), (Shard(0),), (8, 6))
    with pytest.raises(CheckpointError, match=r"global shape \(4, 3\).*\(8, 6\)"):
        plan_reads(saved, other, 1)
    same = Spec(Mesh.create(2), (Shard(0),), (4, 3))
    assert [r.target for r in plan_reads(saved, same, np.int64(1))] == [Chunk((0, 0), (2, 3))]
