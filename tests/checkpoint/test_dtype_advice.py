"""Loading a tensor into a spec of another dtype fails with advice that works as written."""

from __future__ import annotations

import attrs
import pytest
import torch

from meshplan.checkpoint import load, save
from meshplan.errors import CheckpointError
from meshplan.layout import Mesh
from meshplan.placement import Replicate, Sharded, Spec


def test_dtype_mismatch_names_a_fix_that_loads(tmp_path):
    saved = Spec(Mesh.create(1), [Replicate()], (2, 3), "float64")
    x = torch.arange(6, dtype=torch.float64).reshape(2, 3) / 3
    save({"w": Sharded(x, saved, 0)}, tmp_path)
    target = attrs.evolve(saved, dtype="float32")
    with pytest.raises(CheckpointError) as info:
        load(tmp_path, {"w": target}, rank=0)
    message = str(info.value)
    assert "attrs.evolve(spec, dtype='float64')" in message
    assert ".local.to(torch.float32)" in message
    # the advice, followed
    got = load(tmp_path, {"w": attrs.evolve(target, dtype="float64")}, rank=0)["w"]
    assert torch.equal(got.local.to(torch.float32), x.to(torch.float32))
