"""Checksums are zlib's crc32 whichever code computes them (ISA-L when installed)."""

import zlib

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from meshplan.checkpoint import _crc, load, save
from meshplan.layout import Mesh
from meshplan.placement import Shard, Sharded, Spec


@given(data=st.binary(max_size=4096), seed=st.integers(0, 2**32 - 1))
def test_crc32_is_zlibs(data, seed):
    assert _crc.crc32(data, seed) == zlib.crc32(data, seed)
    assert _crc.crc32(memoryview(data), seed) == zlib.crc32(data, seed)


def test_isal_computes_them_when_installed():
    pytest.importorskip("isal")
    assert _crc.FAST


@pytest.mark.parametrize("writer_fast", [True, False])
def test_a_checkpoint_checksummed_by_one_code_verifies_with_the_other(
    tmp_path, monkeypatch, writer_fast
):
    fast = _crc._isal_crc32
    if fast is None:
        pytest.skip("isal is not installed: only zlib computes checksums here")
    spec = Spec(Mesh.create(1), (Shard(0),), (1 << 16,), "float32")
    x = torch.randn(1 << 16)
    monkeypatch.setattr(_crc, "_isal_crc32", fast if writer_fast else None)
    save({"x": Sharded(x, spec, 0)}, tmp_path)
    monkeypatch.setattr(_crc, "_isal_crc32", None if writer_fast else fast)
    assert torch.equal(load(tmp_path, {"x": spec}, rank=0)["x"].local, x)
