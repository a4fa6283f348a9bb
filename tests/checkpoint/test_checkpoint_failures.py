"""A crash mid-save keeps the previous checkpoint; damaged or mismatched checkpoints are refused
with a CheckpointError naming the file and the tensor."""

import json
import os

import pytest
import torch

import meshplan.checkpoint._protocol as protocol
from meshplan.checkpoint import (
    INDEX_NAME,
    CheckpointError,
    ChunkRecord,
    TensorMeta,
    check_tiles,
    load,
    load_all,
    read_metadata,
    save,
    save_all,
)
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

MESH = Mesh.create((2, 2), ("dp", "tp"))
SPEC = Spec(MESH, (StridedShard(0, 2), Shard(1)), (8, 6), "float32")
DST = Spec(Mesh.create(3), (Shard(0),), (8, 6), "float32")


def _states(x, spec=SPEC):
    return {r: {"w": Sharded(t, spec, r)} for r, t in shard(x, spec).items()}


def _loaded(path, dst=DST):
    got = load_all(path, {"w": dst})
    return unshard({r: s["w"].local for r, s in got.items()}, dst)


@pytest.fixture
def saved(tmp_path):
    x = torch.randn(8, 6)
    save_all(_states(x), tmp_path)
    return tmp_path, x


# -- atomicity ---------------------------------------------------------------------------


def test_crash_between_chunk_writes_keeps_the_previous_checkpoint(saved, monkeypatch):
    path, old = saved
    before = sorted(os.listdir(path))
    real = protocol.write_rank
    calls = []

    def crash_on_third_rank(*args, **kwargs):
        calls.append(args[1])
        if len(calls) == 3:
            raise OSError("disk full (simulated)")
        return real(*args, **kwargs)

    monkeypatch.setattr(protocol, "write_rank", crash_on_third_rank)
    with pytest.raises(OSError, match="simulated"):
        save_all(_states(torch.randn(8, 6)), path)
    monkeypatch.undo()
    assert torch.equal(_loaded(path), old)
    # the crashed save left new, unreferenced files; the committed ones are untouched
    assert set(before) <= set(os.listdir(path))
    # the next successful save commits and removes every stale file
    new = torch.randn(8, 6)
    meta = save_all(_states(new), path)
    assert torch.equal(_loaded(path), new)
    assert sorted(os.listdir(path)) == sorted([*meta.files, INDEX_NAME, ".meshplan"])
    assert os.listdir(os.path.join(path, ".meshplan")) == ["commit.lock"]  # no claim, no temp


def test_crash_before_commit_keeps_the_previous_checkpoint(saved, monkeypatch):
    path, old = saved

    def crash(*args, **kwargs):
        raise KeyboardInterrupt  # killed after every shard file was written

    monkeypatch.setattr(protocol, "_commit", crash)
    with pytest.raises(KeyboardInterrupt):
        save_all(_states(torch.randn(8, 6)), path)
    monkeypatch.undo()
    assert torch.equal(_loaded(path), old)


def test_crash_while_writing_the_index_keeps_the_previous_checkpoint(saved, monkeypatch):
    path, old = saved
    real_replace = os.replace

    def crash_on_index(src, dst, *a, **k):
        if os.path.basename(dst) == INDEX_NAME:
            raise OSError("power cut (simulated)")
        return real_replace(src, dst, *a, **k)

    monkeypatch.setattr(protocol.os, "replace", crash_on_index)
    with pytest.raises(CheckpointError, match="cannot commit"):
        save_all(_states(torch.randn(8, 6)), path)
    monkeypatch.undo()
    assert torch.equal(_loaded(path), old)


def test_a_save_that_never_committed_is_no_checkpoint(tmp_path, monkeypatch):
    monkeypatch.setattr(protocol, "_commit", lambda *a: (_ for _ in ()).throw(OSError("crash")))
    with pytest.raises(OSError):
        save_all(_states(torch.randn(8, 6)), tmp_path)
    with pytest.raises(CheckpointError, match="index.json is missing"):
        load_all(tmp_path, {"w": DST})
    with pytest.raises(CheckpointError, match="no checkpoint"):
        read_metadata(tmp_path)


# -- damaged checkpoints -----------------------------------------------------------------


def _flip_last_data_byte(file):
    with open(file, "rb+") as f:
        f.seek(-1, os.SEEK_END)
        b = f.read(1)
        f.seek(-1, os.SEEK_END)
        f.write(bytes([b[0] ^ 0x40]))


def test_a_corrupt_chunk_is_detected_naming_file_and_tensor(saved):
    path, _ = saved
    meta = read_metadata(path)
    victim = meta.files[-1]
    _flip_last_data_byte(os.path.join(path, victim))
    with pytest.raises(CheckpointError, match=r"corrupt: checksum") as err:
        _loaded(path)
    assert victim in str(err.value) and "'w'" in str(err.value)


def test_verify_off_skips_checksums_but_on_catches_them(saved):
    path, _ = saved
    _flip_last_data_byte(os.path.join(path, read_metadata(path).files[-1]))
    load_all(path, {"w": DST}, verify=False)  # reads, unchecked
    with pytest.raises(CheckpointError, match="corrupt"):
        load_all(path, {"w": DST}, verify=True)


def test_a_missing_shard_file_is_named(saved):
    path, _ = saved
    gone = read_metadata(path).files[0]
    os.remove(os.path.join(path, gone))
    with pytest.raises(CheckpointError, match="is missing") as err:
        _loaded(path)
    assert gone in str(err.value) and "'w'" in str(err.value)


def test_a_truncated_shard_file_is_refused(saved):
    path, _ = saved
    victim = os.path.join(path, read_metadata(path).files[0])
    with open(victim, "rb+") as f:
        f.truncate(12)
    with pytest.raises(CheckpointError, match=os.path.basename(victim)):
        _loaded(path)


def test_an_index_with_a_gap_is_refused(saved):
    path, _ = saved
    index = os.path.join(path, INDEX_NAME)
    with open(index) as f:
        doc = json.load(f)
    doc["tensors"]["w"]["chunks"].pop()
    with open(index, "w") as f:
        json.dump(doc, f)
    with pytest.raises(CheckpointError, match="cover"):
        read_metadata(path)


@pytest.mark.parametrize(
    ("edit", "needle"),
    [
        (lambda c: c.update(offsets=[float("inf"), 0]), "inf"),
        (lambda c: c.update(offsets=[1.5, 0]), "1.5"),
        (lambda c: c.update(sizes=[True, 6]), "True"),
        (lambda c: c.update(file=7), "file 7"),
        (lambda c: c.update(file="../elsewhere.safetensors"), "'../elsewhere.safetensors'"),
        (lambda c: c.update(file="/tmp/x.safetensors"), "'/tmp/x.safetensors'"),
        (lambda c: c.update(name=None), "no string"),
    ],
)
def test_a_damaged_chunk_record_is_refused_naming_the_value(saved, edit, needle):
    path, _ = saved
    index = os.path.join(path, INDEX_NAME)
    with open(index) as f:
        doc = json.load(f)
    edit(doc["tensors"]["w"]["chunks"][0])
    with open(index, "w") as f:
        json.dump(doc, f)
    with pytest.raises(CheckpointError, match="malformed") as info:
        read_metadata(path)
    assert needle in str(info.value)
    with pytest.raises(CheckpointError):
        _loaded(path)


def test_two_records_of_one_entry_are_refused(saved):
    # regression: two boxes naming one (file, name) entry loaded its bytes into both and
    # checked the checksum only once, so the load returned wrong data
    path, _ = saved
    index = os.path.join(path, INDEX_NAME)
    with open(index) as f:
        doc = json.load(f)
    chunks = doc["tensors"]["w"]["chunks"]
    a = chunks[0]
    b = next(c for c in chunks[1:] if c["sizes"] == a["sizes"])
    b.update(file=a["file"], name=a["name"], checksum=a["checksum"])
    with open(index, "w") as f:
        json.dump(doc, f)
    with pytest.raises(CheckpointError, match="recorded twice") as info:
        read_metadata(path)
    assert repr(a["name"]) in str(info.value)
    with pytest.raises(CheckpointError, match="recorded twice"):
        _loaded(path)


@pytest.mark.parametrize("count", [2048, 2049, 5000])
def test_a_doubled_chunk_hiding_a_missing_one_is_caught_among_many(count):
    # regression: past 2048 chunks only volumes were compared, so element 6 missing and
    # element 5 saved twice passed
    recs = [ChunkRecord((i,), (1,), "f", f"w#{i}", "") for i in range(count)]
    recs[6] = ChunkRecord((5,), (1,), "f", "w#6", "")
    with pytest.raises(CheckpointError, match="'w#5'.*'w#6'.*overlap"):
        check_tiles(TensorMeta("w", (count,), "float32", recs))
    # and an irregular tiling past the grid's size is checked pairwise
    import meshplan.checkpoint._index as index

    old, index._GRID_CELLS = index._GRID_CELLS, 4
    try:
        with pytest.raises(CheckpointError, match="overlap"):
            check_tiles(TensorMeta("w", (count,), "float32", recs))
    finally:
        index._GRID_CELLS = old


def test_an_unparsable_index_is_refused(saved):
    path, _ = saved
    with open(os.path.join(path, INDEX_NAME), "w") as f:
        f.write("{not json")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        read_metadata(path)


# -- mismatched requests -----------------------------------------------------------------


def test_missing_key_shape_and_dtype_mismatches_are_named(saved):
    path, _ = saved
    with pytest.raises(CheckpointError, match="'v' is not in the checkpoint"):
        load_all(path, {"v": DST})
    with pytest.raises(CheckpointError, match=r"global shape \(8, 6\).*\(6, 8\)"):
        load_all(path, {"w": Spec(MESH, (Shard(0), Shard(1)), (6, 8))})
    with pytest.raises(CheckpointError, match="dtype float32.*float64"):
        load_all(path, {"w": Spec(MESH, (Shard(0), Shard(1)), (8, 6), "float64")})
    with pytest.raises(CheckpointError, match="pass groups= .* or rank="):
        load(path, {"w": DST})
    with pytest.raises(CheckpointError, match="rank 7 is not in the mesh"):
        load(path, {"w": DST}, rank=7)


def test_partial_values_are_refused_naming_the_key(tmp_path):
    spec = Spec(MESH, (Partial(), Shard(0)), (4,))
    states = {r: {"g": Sharded(t, spec, r)} for r, t in shard(torch.ones(4), spec).items()}
    with pytest.raises(CheckpointError, match=r"state\['g'\] is partial"):
        save_all(states, tmp_path)
    assert not os.path.exists(os.path.join(tmp_path, INDEX_NAME))


def test_a_state_missing_ranks_is_refused_before_writing(tmp_path):
    spec = Spec(MESH, (Shard(0), Replicate()), (4,))
    with pytest.raises(CheckpointError, match=r"cover 2 of 4 elements.*save_all"):
        save({"w": Sharded(torch.ones(2), spec, 0)}, tmp_path)
    assert os.listdir(tmp_path) == []


def test_ranks_disagreeing_on_a_tensor_are_refused(tmp_path):
    a = Spec(Mesh.create(2), (Shard(0),), (4,))
    b = Spec(Mesh.create(2), (Shard(0),), (6,))
    states = {0: {"w": Sharded(torch.ones(2), a, 0)}, 1: {"w": Sharded(torch.ones(3), b, 1)}}
    with pytest.raises(CheckpointError, match="different global tensors"):
        save_all(states, tmp_path)


def test_bad_state_values_are_refused(tmp_path):
    with pytest.raises(CheckpointError, match="not a Sharded"):
        save({"w": torch.ones(2)}, tmp_path)
    spec = Spec(Mesh.create(1), (Replicate(),), (2,))
    with pytest.raises(CheckpointError, match="without '#'"):
        save({"a#b": Sharded(torch.ones(2), spec, 0)}, tmp_path)
    with pytest.raises(CheckpointError, match="belongs to rank 0"):
        save_all({3: {"w": Sharded(torch.ones(2), spec, 0)}}, tmp_path)
