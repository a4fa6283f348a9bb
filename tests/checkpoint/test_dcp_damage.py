"""Regressions and a fuzz test: a hostile or damaged torch DCP checkpoint fails at once with a
CheckpointError naming the file and the tensor at fault; it never hangs, never exhausts
memory and never loads a wrong tensor.

The checkpoints are real ones, written by ``torch.distributed.checkpoint`` in one process
(several chunks per tensor, see ``_dcp_helpers``). Loads that would hang or blow up before
their fix run in a child process (bounded by a timeout and an address-space limit) or
under an alarm.
"""

import contextlib
import io
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import zipfile

import pytest
import torch
from _dcp_helpers import grid_boxes, rewrite_metadata, save_dcp_tiled
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from meshplan.checkpoint import load_dcp, load_dcp_all, read_dcp_metadata
from meshplan.errors import CheckpointError
from meshplan.layout import Mesh
from meshplan.placement import Replicate, Shard, Spec, unshard

W = torch.arange(32, dtype=torch.float32).reshape(8, 4) + 0.5
B = torch.arange(6, dtype=torch.int64) * 7
W_BOXES = grid_boxes((8, 4), ((3,), (2,)))  # rows 0:3, 3:8 x cols 0:2, 2:4
B_BOXES = [((0,), (6,))]
DATA = "__0_0.distcp"


def _whole(x):
    return Spec(Mesh.create(1), (Replicate(),), tuple(x.shape), str(x.dtype).removeprefix("torch."))


TARGETS = {"w": _whole(W), "b": _whole(B)}


@contextlib.contextmanager
def _bounded(seconds: float = 30.0):
    """Raise TimeoutError in this (main) thread after ``seconds``: a hang fails the test."""

    def alarm(signum, frame):
        raise TimeoutError(f"the load did not return within {seconds} s")

    old = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _save(path) -> str:
    save_dcp_tiled(str(path), {"w": (W, W_BOXES), "b": (B, B_BOXES)})
    return str(path)


@pytest.fixture
def saved(tmp_path):
    return _save(tmp_path / "dcp")


def _load(path):
    with _bounded():
        got = load_dcp(path, TARGETS)
    return {k: s.local for k, s in got.items()}


def test_a_tiled_dcp_checkpoint_loads_bit_exact(saved):
    got = _load(saved)
    assert torch.equal(got["w"], W) and torch.equal(got["b"], B)
    spec = Spec(Mesh.create(3), (Shard(0),), (8, 4), "float32")
    every = load_dcp_all(saved, {"w": spec})
    assert torch.equal(unshard({r: every[r]["w"].local for r in every}, spec), W)
    meta = read_dcp_metadata(saved)
    assert {c.file for c in meta["w"].chunks} == {DATA}
    assert len({c.name for c in meta["w"].chunks}) == len(W_BOXES)


# -- 1. data files that are not regular files are refused before they are opened -------------


_CHILD_LOAD = """
import sys
from meshplan.checkpoint import load_dcp, load_dcp_all
from meshplan.errors import CheckpointError
from meshplan.layout import Mesh
from meshplan.placement import Replicate, Spec
spec = Spec(Mesh.create(1), (Replicate(),), (8, 4), "float32")
for entry in (load_dcp, load_dcp_all):
    try:
        entry(sys.argv[1], {"w": spec})
        print("loaded")
    except CheckpointError as e:
        print("CheckpointError", e)
    except BaseException as e:
        print("other", type(e).__name__, e)
"""


def _child(code: str, *args: str, timeout: float = 180.0) -> str:
    """Run ``code`` in a fresh interpreter limited to 2 GiB of address space; its output."""
    prelude = "import resource\nresource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))\n"
    try:
        done = subprocess.run(
            [sys.executable, "-c", prelude + textwrap.dedent(code), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"the child did not finish within {timeout} s (a hang)")
    return done.stdout + done.stderr


def test_a_dcp_data_file_that_is_a_fifo_is_refused_at_once(saved):
    data = os.path.join(saved, DATA)
    os.remove(data)
    os.mkfifo(data)
    lines = _child(_CHILD_LOAD, saved, timeout=180).splitlines()
    assert len(lines) == 2, lines  # load_dcp, then load_dcp_all
    for out in lines:
        assert out.startswith("CheckpointError"), out
        assert DATA in out and "regular file" in out, out


@pytest.mark.parametrize("kind", ["directory", "device"])
def test_a_dcp_data_file_that_is_a_directory_or_a_device_is_refused(saved, kind):
    data = os.path.join(saved, DATA)
    os.remove(data)
    if kind == "directory":
        os.mkdir(data)
    else:
        os.symlink("/dev/zero", data)
    with pytest.raises(CheckpointError, match=f"{DATA}.*'w'.*not a regular file"):
        _load(saved)


# -- 2. chunks that do not tile their tensor are refused, naming tensor and chunk ---------------


def _drop_chunk(meta):
    from torch.distributed.checkpoint.metadata import MetadataIndex

    chunk = meta.state_dict_metadata["w"].chunks.pop(1)
    del meta.storage_data[MetadataIndex("w", chunk.offsets)]


def _move_chunk(offsets):
    def move(meta):
        from torch.distributed.checkpoint.metadata import MetadataIndex

        chunk = meta.state_dict_metadata["w"].chunks[3]
        info = meta.storage_data.pop(MetadataIndex("w", chunk.offsets))
        chunk.offsets = torch.Size(offsets)
        meta.storage_data[MetadataIndex("w", chunk.offsets)] = info

    return move


def _list_twice(meta):
    chunks = meta.state_dict_metadata["w"].chunks
    chunks.append(chunks[0])


def _grow_chunk(meta):
    chunk = meta.state_dict_metadata["w"].chunks[3]
    chunk.sizes = torch.Size([chunk.sizes[0] + 1, chunk.sizes[1]])


@pytest.mark.parametrize(
    "damage, names",
    [
        (_drop_chunk, r"'w'.*cover 26 of 32"),
        (_move_chunk((2, 2)), r"'w'.*chunk.*overlap"),
        (_list_twice, r"'w'.*chunk.*(twice|overlap)"),
        (_grow_chunk, r"'w'.*chunk.*outside"),
    ],
    ids=["gap", "overlap", "listed-twice", "out-of-bounds"],
)
def test_dcp_chunks_that_do_not_tile_their_tensor_are_refused(saved, damage, names):
    rewrite_metadata(saved, damage)
    for read in (lambda: read_dcp_metadata(saved), lambda: _load(saved)):
        with pytest.raises(CheckpointError, match=names):
            read()


# -- 3. damage of every kind raises a CheckpointError naming the file and the tensor -----------


def _entries(path):
    """Storage entries of ``path``: fqn, chunk offsets -> (file, offset, length)."""
    with open(os.path.join(path, ".metadata"), "rb") as f:
        meta = pickle.load(f)
    return {
        (index.fqn, tuple(index.offset)): (info.relative_path, info.offset, info.length)
        for index, info in meta.storage_data.items()
    }


def _member_span(path, entry, member):
    """Absolute (start, size) of the raw bytes of ``member`` in the zip of ``entry``."""
    file, offset, length = _entries(path)[entry]
    with open(os.path.join(path, file), "rb") as f:
        f.seek(offset)
        blob = f.read(length)
    info = next(
        i for i in zipfile.ZipFile(io.BytesIO(blob)).infolist() if i.filename.endswith(member)
    )
    name_len = int.from_bytes(blob[info.header_offset + 26 : info.header_offset + 28], "little")
    extra_len = int.from_bytes(blob[info.header_offset + 28 : info.header_offset + 30], "little")
    return offset + info.header_offset + 30 + name_len + extra_len, info.file_size


def _flip(path, at, mask=0x10):
    name = os.path.join(path, DATA)
    with open(name, "r+b") as f:
        f.seek(at)
        byte = f.read(1)[0]
        f.seek(at)
        f.write(bytes([byte ^ mask]))


def _flip_tensor_byte(path):
    start, size = _member_span(path, ("w", (3, 2)), "data/0")
    _flip(path, start + size // 2)


def _flip_data_pkl_byte(path):
    start, size = _member_span(path, ("w", (3, 2)), "data.pkl")
    _flip(path, start + size // 2, 0x01)


def _flip_zip_header_byte(path):
    _flip(path, _entries(path)[("w", (3, 2))][1] + 1)


def _truncate(path):
    name = os.path.join(path, DATA)
    os.truncate(name, os.path.getsize(name) - 100)


def _meta(change):
    return lambda path: rewrite_metadata(path, change)


def _storage(field, value):
    def change(meta):
        for index, info in meta.storage_data.items():
            if index.fqn == "w" and tuple(index.offset) == (3, 2):
                setattr(info, field, value(info) if callable(value) else value)

    return _meta(change)


def _same_bytes(meta):
    """Point the chunk at (0, 2) at the bytes of the chunk at (0, 0) (same shape and dtype)."""
    by_offset = {tuple(i.offset): i for i in meta.storage_data if i.fqn == "w"}
    meta.storage_data[by_offset[(0, 2)]] = meta.storage_data[by_offset[(0, 0)]]


def _drop_storage(meta):
    for index in list(meta.storage_data):
        if index.fqn == "w" and tuple(index.offset) == (3, 2):
            del meta.storage_data[index]


def _tensor_field(field, value):
    return _meta(lambda meta: setattr(meta.state_dict_metadata["w"], field, value))


def _chunk_field(field, value):
    return _meta(lambda meta: setattr(meta.state_dict_metadata["w"].chunks[0], field, value))


def _dtype(value):
    return _meta(lambda meta: setattr(meta.state_dict_metadata["w"].properties, "dtype", value))


DAMAGE = {
    "data file missing": (lambda p: os.remove(os.path.join(p, DATA)), f"{DATA}.*'w'|'w'.*{DATA}"),
    "data file truncated": (_truncate, f"{DATA}.*'b'|'b'.*{DATA}"),
    "tensor byte flipped": (_flip_tensor_byte, f"{DATA}.*'w'|'w'.*{DATA}"),
    "data.pkl byte flipped": (_flip_data_pkl_byte, f"{DATA}.*'w'|'w'.*{DATA}"),
    "zip header byte flipped": (_flip_zip_header_byte, f"{DATA}.*'w'|'w'.*{DATA}"),
    "storage offset shifted": (_storage("offset", lambda i: i.offset + 1), "'w'"),
    "storage offset negative": (_storage("offset", -5), "'w'"),
    "storage offset a string": (_storage("offset", "12"), "'w'"),
    "storage length too long": (_storage("length", 10**12), "'w'"),
    "storage length short": (_storage("length", lambda i: i.length - 10), "'w'"),
    "storage path an int": (_storage("relative_path", 7), "'w'"),
    "storage path missing file": (_storage("relative_path", "__9_0.distcp"), "__9_0.*'w'"),
    "storage transformed": (_storage("transform_descriptors", ["zstd"]), "'w'"),
    "two chunks share bytes": (_meta(_same_bytes), "'w'"),
    "storage entry missing": (_meta(_drop_storage), "'w'"),
    "storage data not a dict": (_meta(lambda m: setattr(m, "storage_data", [1])), "storage"),
    "entries not a dict": (_meta(lambda m: setattr(m, "state_dict_metadata", None)), "metadata"),
    "dtype a string": (_dtype("float32"), "'w'"),
    "dtype of another size": (_dtype(torch.float64), "'w'.*float"),
    "size a string": (_tensor_field("size", "8x4"), "'w'"),
    "size of floats": (_tensor_field("size", (8.0, 4.0)), "'w'"),
    "chunks not a list": (_tensor_field("chunks", None), "'w'"),
    "properties missing": (_tensor_field("properties", None), "'w'"),
    "chunk offsets a string": (_chunk_field("offsets", "00"), "'w'"),
    "chunk sizes negative": (_chunk_field("sizes", torch.Size([-3, 2])), "'w'"),
}


@pytest.mark.parametrize("kind", list(DAMAGE))
def test_a_damaged_dcp_checkpoint_raises_a_checkpoint_error_naming_what(saved, kind):
    damage, names = DAMAGE[kind]
    damage(saved)
    with pytest.raises(CheckpointError, match=names):
        _load(saved)


def test_a_flipped_byte_in_another_tensors_data_leaves_this_one_loadable(saved):
    _flip_tensor_byte(saved)
    got = load_dcp(saved, {"b": TARGETS["b"]})
    assert torch.equal(got["b"].local, B)


# -- 4. memo references cannot multiply a chunk: bounded time and memory -----------------------


_MEMO_BOMB = """
import pickle, resource, sys, time
import torch
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata, Metadata, MetadataIndex, TensorProperties, TensorStorageMetadata)
from meshplan.checkpoint import load_dcp, read_dcp_metadata
from meshplan.errors import CheckpointError
from meshplan.layout import Mesh
from meshplan.placement import Replicate, Spec

def bomb(kind):
    one = torch.Size([0])
    if kind == "one chunk":  # one object, referenced a million times
        chunks = [ChunkStorageMetadata(one, torch.Size([4]))] * 1_000_000
    else:  # distinct objects sharing their offsets and sizes
        four = torch.Size([4])
        chunks = [ChunkStorageMetadata(one, four) for _ in range(50_000)]
    entry = TensorStorageMetadata(TensorProperties(torch.float32), torch.Size([4]), chunks)
    storage = {MetadataIndex("w", one): _StorageInfo("__0_0.distcp", 0, 10)}
    with open(path + "/.metadata", "wb") as f:
        pickle.dump(Metadata({"w": entry}, storage_data=storage), f)
    del chunks, entry


path = sys.argv[1]
for kind, how in (("one chunk", "read"), ("one chunk", "load"), ("distinct chunks", "read")):
    bomb(kind)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0, c0 = time.perf_counter(), time.process_time()
    try:
        if how == "load":
            load_dcp(path, {"w": Spec(Mesh.create(1), (Replicate(),), (4,), "float32")})
        else:
            read_dcp_metadata(path)
        print("loaded")
    except CheckpointError as e:
        grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) >> 10
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        print(f"CheckpointError {wall:.2f} s wall {cpu:.2f} s cpu +{grown} MB: {e}")
    except BaseException as e:
        print("other", type(e).__name__, e)
"""


def test_a_dcp_metadata_multiplying_chunks_by_memo_references_is_refused_early(tmp_path):
    # one chunk referenced 1M times (read, then load), 50k distinct chunks sharing offsets
    lines = _child(_MEMO_BOMB, str(tmp_path), timeout=240).splitlines()
    assert len(lines) == 3, lines
    for out in lines:
        assert out.startswith("CheckpointError"), out
        assert "chunk" in out and "'w'" in out, out
        grown = int(out.split(" MB:")[0].rsplit("+", 1)[1])
        assert grown < 200, out  # the pickle's own objects, not a record per reference


_HUGE_MEMO_INDEX = """
import pickle, sys, torch
from torch.distributed.checkpoint.metadata import Metadata
from meshplan.checkpoint import read_dcp_metadata
from meshplan.errors import CheckpointError

# protocol 2 memoizes with BINPUT / LONG_BINPUT: make one index 2**32 - 1
data = bytearray(pickle.dumps(Metadata({}, storage_data={}), protocol=2))
at = data.index(b"q")  # the first BINPUT
data[at : at + 2] = b"r" + (2**32 - 1).to_bytes(4, "little")
with open(sys.argv[1] + "/.metadata", "wb") as f:
    f.write(data)
try:
    read_dcp_metadata(sys.argv[1])
    print("loaded")
except CheckpointError as e:
    print("CheckpointError", e)
except BaseException as e:
    print("other", type(e).__name__, e)
"""


def test_a_dcp_metadata_naming_a_huge_memo_index_costs_no_memory(tmp_path):
    # the C unpickler grows its memo array to the index named (~64 GB here)
    out = _child(_HUGE_MEMO_INDEX, str(tmp_path), timeout=180)
    assert out.startswith(("loaded", "CheckpointError")), out
    assert "MemoryError" not in out, out


# -- the fuzz test: random damage to real checkpoints ------------------------------------------


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return _save(tmp_path_factory.mktemp("dcp-base") / "dcp")


_WRONG = st.one_of(
    st.none(),
    st.integers(-(2**70), 2**70),
    st.text(max_size=3),
    st.floats(allow_nan=True),
    st.lists(st.integers(-3, 10), max_size=3).map(tuple),
    st.lists(st.integers(-3, 10), max_size=3)
    .map(torch.Size)
    .filter(lambda s: min(s, default=0) >= 0),
    st.sampled_from([torch.float64, torch.int64, torch.Size([3, 2]), b"\x00", [], {}]),
)


def _fields(meta):
    """Every (object, attribute) a DCP metadata's load reads."""
    out = [(meta, "state_dict_metadata"), (meta, "storage_data")]
    for entry in meta.state_dict_metadata.values():
        out += [(entry, "size"), (entry, "chunks"), (entry, "properties")]
        out.append((entry.properties, "dtype"))
        for chunk in entry.chunks:
            out += [(chunk, "offsets"), (chunk, "sizes")]
    for index, info in meta.storage_data.items():
        out += [(info, f) for f in ("relative_path", "offset", "length", "transform_descriptors")]
        out += [(index, "offset"), (index, "fqn")]
    return out


def _shift(value, draw):
    """A plausible wrong value of the same type: an int or one entry of a size moved."""
    if isinstance(value, int):
        return max(0, value + draw(st.integers(-3, 3)))
    if isinstance(value, torch.Size) and len(value):
        d = draw(st.integers(0, len(value) - 1))
        moved = list(value)
        moved[d] = max(0, moved[d] + draw(st.sampled_from([-2, -1, 1, 2])))
        return torch.Size(moved)
    return draw(_WRONG)


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_damaged_dcp_checkpoints_raise_checkpoint_errors_or_load_exact(base, data):
    from torch.distributed.checkpoint.metadata import MetadataIndex

    draw = data.draw
    with tempfile.TemporaryDirectory() as tmp:
        path = shutil.copytree(base, os.path.join(tmp, "dcp"))
        how = draw(st.sampled_from(["bytes", "truncate", "field", "shift"]))
        if how in ("bytes", "truncate"):
            name = os.path.join(path, draw(st.sampled_from([DATA, ".metadata"])))
            with open(name, "rb") as f:
                blob = bytearray(f.read())
            if how == "bytes":
                for _ in range(draw(st.integers(1, 3))):
                    at = draw(st.integers(0, len(blob) - 1))
                    blob[at] ^= draw(st.integers(1, 255))
            else:
                del blob[draw(st.integers(0, len(blob) - 1)) :]
            with open(name, "wb") as f:
                f.write(bytes(blob))
        else:

            def change(meta):
                obj, field = draw(st.sampled_from(_fields(meta)))
                value = getattr(obj, field)
                wrong = _shift(value, draw) if how == "shift" else draw(_WRONG)
                object.__setattr__(obj, field, wrong)
                if isinstance(obj, MetadataIndex):  # a key: re-hash it
                    meta.storage_data = dict(list(meta.storage_data.items()))

            try:
                rewrite_metadata(path, change)
            except (TypeError, pickle.PicklingError):  # e.g. an unhashable key: no file to read
                return
        n = draw(st.integers(1, 3))
        specs = {
            "w": Spec(Mesh.create(n), (draw(st.sampled_from([Shard(0), Shard(1)])),), (8, 4)),
            "b": Spec(Mesh.create(n), (Shard(0),), (6,), "int64"),
        }
        try:
            with _bounded():
                got = load_dcp_all(path, specs)
        except CheckpointError as e:
            assert str(e)
            return
        for key, x in (("w", W), ("b", B)):
            whole = unshard({r: got[r][key].local for r in got}, specs[key])
            assert whole.dtype == x.dtype and torch.equal(whole, x), key
