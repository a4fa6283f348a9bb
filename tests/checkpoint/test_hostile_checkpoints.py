"""Regressions: hostile or broken checkpoint directories fail at once with a CheckpointError.

A FIFO, a device or an oversized file where the index or a shard should be; an index whose
tiling check would take minutes; a DCP ``.metadata`` that runs code when unpickled; an index
declaring shapes its shard files do not hold. Cases that would hang or exhaust memory
before their fix run in a child process bounded by a timeout and an address-space limit.
"""

import itertools
import json
import os
import pickle
import subprocess
import sys
import textwrap
import threading

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from meshplan.checkpoint import (
    INDEX_NAME,
    CheckpointError,
    ChunkRecord,
    Metadata,
    TensorMeta,
    check_tiles,
    load,
    load_all,
    metadata_to_json,
    read_metadata,
    save_all,
)
from meshplan.layout import Mesh
from meshplan.placement import Replicate, Shard, Sharded, Spec, shard

SPEC = Spec(Mesh.create(2), (Shard(0),), (4,), "int64")


def _saved(path):
    states = {r: {"w": Sharded(t, SPEC, r)} for r, t in shard(torch.arange(4), SPEC).items()}
    return save_all(states, path)


def _child(code: str, timeout: float = 60.0) -> str:
    """Run ``code`` in a fresh interpreter limited to 2 GiB of address space; its stdout."""
    prelude = "import resource\nresource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))\n"
    done = subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return done.stdout + done.stderr


_READ_INDEX = """
    import sys, time
    from meshplan.checkpoint import read_metadata
    from meshplan.errors import CheckpointError
    t0 = time.perf_counter()
    try:
        read_metadata(sys.argv[1] if len(sys.argv) > 1 else {path!r})
    except CheckpointError as e:
        print("CheckpointError", round(time.perf_counter() - t0, 3), e)
    except BaseException as e:
        print("other", type(e).__name__, e)
"""


# -- 4. non-regular files and oversized indexes --------------------------------------------


def test_an_index_that_is_a_fifo_is_refused_at_once(tmp_path):
    os.mkfifo(tmp_path / INDEX_NAME)
    try:
        out = _child(_READ_INDEX.format(path=str(tmp_path)), timeout=20)
    except subprocess.TimeoutExpired:
        pytest.fail("read_metadata blocked on a FIFO index")
    assert out.startswith("CheckpointError"), out
    assert "not a regular file" in out, out


@pytest.mark.parametrize("target", ["/dev/zero", "sparse"])
def test_an_endless_or_huge_index_is_refused_without_reading_it(tmp_path, target):
    if target == "sparse":
        target = str(tmp_path / "big.json")
        with open(target, "wb") as f:
            f.write(b'{"format": "meshplan.checkpoint", "version": 1, "tensors": {}}')
            f.truncate(6 << 30)  # 6 GiB, sparse
    os.symlink(target, tmp_path / INDEX_NAME)
    out = _child(_READ_INDEX.format(path=str(tmp_path)), timeout=60)
    assert out.startswith("CheckpointError"), out
    assert "not a regular file" in out or "larger than" in out, out


def test_a_shard_that_is_a_fifo_is_refused_at_once(tmp_path):
    meta = _saved(tmp_path)
    shard0 = tmp_path / meta.files[0]
    os.remove(shard0)
    os.mkfifo(shard0)
    code = f"""
        from meshplan.checkpoint import load_all, read_metadata, CheckpointError
        from meshplan.layout import Mesh
        from meshplan.placement import Shard, Spec
        spec = Spec(Mesh.create(2), (Shard(0),), (4,), "int64")
        for verify in (True, False):
            try:
                load_all({str(tmp_path)!r}, {{"w": spec}}, verify=verify)
                print("loaded")
            except CheckpointError as e:
                print("CheckpointError", e)
    """
    try:
        out = _child(code, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("load blocked on a FIFO shard file")
    lines = out.strip().splitlines()
    assert len(lines) == 2 and all(x.startswith("CheckpointError") for x in lines), out
    assert "not a regular file" in out, out


# -- 5. the tiling check is linear ---------------------------------------------------------


def _hostile_index(rows: int) -> Metadata:
    """``2 * rows`` chunks tiling a (1, rows, rows + 1) tensor, each row cut at its own
    column: a grid of rows * (rows + 1) cells, every chunk overlapping every other in dim 0."""
    chunks = []
    for i in range(rows):
        chunks.append(ChunkRecord((0, i, 0), (1, 1, i + 1), "f", f"w#{2 * i}", ""))
        chunks.append(ChunkRecord((0, i, i + 1), (1, 1, rows - i), "f", f"w#{2 * i + 1}", ""))
    return Metadata({"w": TensorMeta("w", (1, rows, rows + 1), "float32", chunks)})


def test_a_megabyte_index_of_thousands_of_chunks_is_checked_in_seconds(tmp_path):
    text = metadata_to_json(_hostile_index(4200))
    assert len(text) > 1_000_000
    (tmp_path / INDEX_NAME).write_text(text)
    got: list = []
    worker = threading.Thread(target=lambda: got.append(read_metadata(tmp_path)), daemon=True)
    worker.start()
    worker.join(timeout=20)  # the quadratic check took ~50 s of CPU
    assert not worker.is_alive(), "read_metadata's tiling check is still running after 20 s"
    assert len(got[0]["w"].chunks) == 8400


def test_a_hostile_index_with_one_overlap_is_still_caught(tmp_path):
    meta = _hostile_index(2000)
    chunks = list(meta["w"].chunks)
    a, b = chunks[10], chunks[11]  # row 5 cut at 6: make both halves one column wider
    chunks[10] = ChunkRecord(a.offsets, (1, 1, a.sizes[2] + 1), a.file, a.name, "")
    chunks[11] = ChunkRecord(b.offsets, (1, 1, b.sizes[2]), b.file, b.name, "")
    c = chunks[12]  # and the next row one column shorter, so the volume still adds up
    chunks[12] = ChunkRecord(c.offsets, (1, 1, c.sizes[2] - 1), c.file, c.name, "")
    bad = Metadata({"w": TensorMeta("w", (1, 2000, 2001), "float32", chunks)})
    (tmp_path / INDEX_NAME).write_text(metadata_to_json(bad))
    with pytest.raises(CheckpointError, match="overlap"):
        read_metadata(tmp_path)


@st.composite
def _boxes(draw):
    """A shape and boxes inside it: a guillotine tiling of it, then maybe one box moved,
    resized, doubled or dropped."""
    shape = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=3)))
    boxes = [((0,) * len(shape), shape)]
    for _ in range(draw(st.integers(0, 6))):
        k = draw(st.integers(0, len(boxes) - 1))
        lo, size = boxes[k]
        d = draw(st.integers(0, len(shape) - 1))
        if size[d] < 2:
            continue
        cut = draw(st.integers(1, size[d] - 1))
        a = (lo, size[:d] + (cut,) + size[d + 1 :])
        b = (lo[:d] + (lo[d] + cut,) + lo[d + 1 :], size[:d] + (size[d] - cut,) + size[d + 1 :])
        boxes[k : k + 1] = [a, b]
    change = draw(st.sampled_from(["none", "move", "resize", "double", "drop"]))
    k = draw(st.integers(0, len(boxes) - 1))
    lo, size = boxes[k]
    d = draw(st.integers(0, len(shape) - 1))
    if change == "move" and lo[d] + size[d] < shape[d]:
        boxes[k] = (lo[:d] + (lo[d] + 1,) + lo[d + 1 :], size)
    elif change == "resize" and size[d] > 1:
        boxes[k] = (lo, size[:d] + (size[d] - 1,) + size[d + 1 :])
    elif change == "double":
        boxes.append(boxes[k])
    elif change == "drop" and len(boxes) > 1:
        del boxes[k]
    return shape, boxes


@given(_boxes())
def test_check_tiles_agrees_with_counting_every_element(case):
    shape, boxes = case
    counts = dict.fromkeys(itertools.product(*map(range, shape)), 0)
    for lo, size in boxes:
        for point in itertools.product(*(range(o, o + n) for o, n in zip(lo, size, strict=True))):
            counts[point] += 1
    chunks = [ChunkRecord(lo, size, "f", f"w#{i}", "") for i, (lo, size) in enumerate(boxes)]
    meta = TensorMeta("w", shape, "float32", chunks)
    if set(counts.values()) == {1}:
        check_tiles(meta)
    else:
        with pytest.raises(CheckpointError, match="cover|overlap"):
            check_tiles(meta)


# -- 6. DCP metadata is never unpickled unrestricted --------------------------------------


class _Payload:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


@pytest.mark.parametrize("entry", ["read_dcp_metadata", "load_dcp"])
def test_a_dcp_metadata_that_runs_code_is_refused_before_it_runs(tmp_path, entry):
    import meshplan.checkpoint as ckpt

    marker = str(tmp_path / "ran")
    with open(tmp_path / ".metadata", "wb") as f:
        pickle.dump({"state_dict_metadata": _Payload(marker)}, f)
    with pytest.raises(CheckpointError, match="os.*mkdir|posix.*mkdir"):
        if entry == "load_dcp":
            ckpt.load_dcp(tmp_path, {"w": Spec(Mesh.create(1), (Replicate(),), (4,), "int64")})
        else:
            ckpt.read_dcp_metadata(tmp_path)
    assert not os.path.exists(marker)


def test_a_dcp_metadata_of_another_type_is_refused(tmp_path):
    from meshplan.checkpoint import read_dcp_metadata

    with open(tmp_path / ".metadata", "wb") as f:
        pickle.dump({"a": torch.Size([2])}, f)  # allowed classes, but no DCP Metadata
    with pytest.raises(CheckpointError, match="not a DCP Metadata"):
        read_dcp_metadata(tmp_path)


def test_a_dcp_metadata_pointing_outside_its_directory_is_refused(tmp_path):
    import warnings

    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.filesystem import _StorageInfo

    from meshplan.checkpoint import load_dcp

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(
            {"w": torch.arange(4)}, storage_writer=dcp.FileSystemWriter(tmp_path), no_dist=True
        )
    with open(tmp_path / ".metadata", "rb") as f:
        meta = pickle.load(f)
    for k, info in meta.storage_data.items():
        meta.storage_data[k] = _StorageInfo("../../secret", info.offset, info.length)
    with open(tmp_path / ".metadata", "wb") as f:
        pickle.dump(meta, f)
    with pytest.raises(CheckpointError, match="outside the checkpoint"):
        load_dcp(tmp_path, {"w": Spec(Mesh.create(1), (Replicate(),), (4,), "int64")})


# -- 7. shapes the shard files do not hold are refused before allocating --------------------


def test_an_index_declaring_terabytes_fails_on_the_shard_headers_before_allocating(tmp_path):
    one = Spec(Mesh.create(1), (Replicate(),), (4,), "float32")
    meta = save_all({0: {"w": Sharded(torch.ones(4), one, 0)}}, tmp_path)
    rec = meta["w"].chunks[0]
    huge = (2**20, 2**20)
    index = tmp_path / INDEX_NAME
    doc = json.loads(index.read_text())
    chunk = {"offsets": [0, 0], "sizes": list(huge), "file": rec.file, "name": rec.name}
    doc["tensors"]["w"] = {
        "shape": list(huge),
        "dtype": "float32",
        "chunks": [chunk | {"checksum": rec.checksum}],
    }
    index.write_text(json.dumps(doc))
    assert read_metadata(tmp_path)["w"].shape == huge  # the index alone is consistent
    target = Spec(Mesh.create(1), (Replicate(),), huge, "float32")
    for verify in (True, False):
        with pytest.raises(CheckpointError, match="header"):
            load(tmp_path, {"w": target}, verify=verify)


def test_a_shard_header_declaring_more_bytes_than_its_file_is_refused(tmp_path):
    import struct

    one = Spec(Mesh.create(1), (Replicate(),), (4,), "float32")
    meta = save_all({0: {"w": Sharded(torch.ones(4), one, 0)}}, tmp_path)
    path = tmp_path / meta.files[0]
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    name = meta["w"].chunks[0].name
    header[name]["shape"] = [2**40]
    header[name]["data_offsets"] = [0, 2**42]
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + data[8 + n :])
    with pytest.raises(CheckpointError, match="truncated|header"):
        load_all(tmp_path, {"w": one})


def test_a_truncated_shard_is_refused_by_its_header_check(tmp_path):
    meta = _saved(tmp_path)
    path = tmp_path / meta.files[1]
    path.write_bytes(path.read_bytes()[:-3])
    for verify in (True, False):
        with pytest.raises(CheckpointError, match="truncated"):
            load(tmp_path, {"w": SPEC}, rank=1, verify=verify)
    assert load(tmp_path, {"w": SPEC}, rank=0)["w"].local.tolist() == [0, 1]
