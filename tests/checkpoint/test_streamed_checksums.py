"""Checksums taken while a shard file is synced to disk equal checksums of the bytes read
back, for every dtype and shape, and a failed fsync is an error, not a file that looks
complete."""

import errno
import os

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file

import meshplan.checkpoint._files as files
from meshplan.checkpoint._encoding import checksum, digest_text, place_seed
from meshplan.checkpoint._files import write_safetensors

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.int8, torch.int64, torch.bool]


@st.composite
def _tensors(draw):
    out = {}
    for i in range(draw(st.integers(1, 4))):
        dtype = draw(st.sampled_from(DTYPES))
        shape = tuple(draw(st.lists(st.integers(0, 9), min_size=0, max_size=3)))
        gen = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
        t = torch.randint(0, 100, shape, generator=gen).to(dtype)
        out[f"t{i}#{draw(st.integers(0, 3))}"] = t
    return out


@settings(max_examples=40, deadline=None)
@given(_tensors(), st.booleans())
def test_checksums_taken_beside_the_fsync_match_the_bytes_written(
    tmp_path_factory, tensors, overlap
):
    path = os.path.join(tmp_path_factory.mktemp("s"), "f.safetensors")
    seeds = {
        name: place_seed(name, (i,), tuple(t.shape)) for i, (name, t) in enumerate(tensors.items())
    }
    real = files._OVERLAP_BYTES
    files._OVERLAP_BYTES = 0 if overlap else real  # small tensors: serial unless forced
    try:
        crcs = write_safetensors(tensors, path, {"k": "v"}, seeds)
    finally:
        files._OVERLAP_BYTES = real
    back = load_file(path)
    for i, (name, t) in enumerate(tensors.items()):
        assert torch.equal(back[name], t)
        want = checksum(back[name], key=name, offsets=(i,))
        assert digest_text(crcs[name], boxed=True) == want


def test_without_seeds_a_checksum_covers_the_bytes_only(tmp_path):
    t = torch.randn(3000)
    crcs = write_safetensors({"w#0": t}, str(tmp_path / "x.safetensors"), {})
    assert digest_text(crcs["w#0"], boxed=False) == checksum(t)


@pytest.mark.parametrize("overlap", [False, True])  # serial, beside the fsync
def test_a_failed_fsync_raises(tmp_path, monkeypatch, overlap):
    def failing(fd):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "fsync", failing)
    monkeypatch.setattr(files, "_OVERLAP_BYTES", 0 if overlap else 1 << 30)
    with pytest.raises(OSError, match="Input/output"):
        write_safetensors({"w#0": torch.randn(64)}, str(tmp_path / "x.safetensors"), {})


@settings(max_examples=20, deadline=None)
@given(tensors=_tensors(), piece=st.sampled_from([8, 64, 1000]))
def test_a_file_written_back_piece_by_piece_holds_the_same_bytes(tmp_path_factory, tensors, piece):
    # pieces of a few bytes: the writeback of every piece is started as it is written
    started = []
    real = files._sync_file_range()

    def record(fd, offset, nbytes, flags):
        started.append((offset, nbytes))
        return real(fd, offset, nbytes, flags) if real is not None else 0

    path = os.path.join(tmp_path_factory.mktemp("w"), "f.safetensors")
    saved = files._Writeback.PIECE, files._sync_file_range
    files._Writeback.PIECE, files._sync_file_range = piece, lambda: record
    try:
        crcs = write_safetensors(tensors, path, {})
    finally:
        files._Writeback.PIECE, files._sync_file_range = saved
    back = load_file(path)
    for name, t in tensors.items():
        assert torch.equal(back[name], t)
        assert digest_text(crcs[name], boxed=False) == checksum(t)
    # the ranges started follow one another from the file's start, within the file
    size = os.path.getsize(path)
    assert all(a + n == b for (a, n), (b, _) in zip(started, started[1:], strict=False))
    assert not started or (started[0][0] == 0 and started[-1][0] + started[-1][1] <= size)
