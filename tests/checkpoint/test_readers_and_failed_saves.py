"""Regressions: a load while another process saves gets the old or the new checkpoint,
never an error or a mix; a save that raises (disk full, file too large) removes what it
wrote; a background save resolves a relative path when it is called."""

import os
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from meshplan.checkpoint import INDEX_NAME, CheckpointError, load_all, read_metadata, save, save_all
from meshplan.layout import Mesh
from meshplan.placement import Replicate, Shard, Sharded, Spec, shard

SPEC = Spec(Mesh.create(4), (Shard(0),), (64, 8), "float32")


def _states(value, spec=SPEC):
    full = torch.full(spec.shape, float(value))
    return {r: {"w": Sharded(t, spec, r)} for r, t in shard(full, spec).items()}


def _leftovers(path):
    """Files in the checkpoint directory that belong to no committed checkpoint."""
    names = set(os.listdir(path)) - {INDEX_NAME, ".meshplan", *read_metadata(path).files}
    state = os.path.join(path, ".meshplan")
    inner = set(os.listdir(state)) - {"commit.lock"} if os.path.isdir(state) else set()
    return sorted(names) + sorted(f".meshplan/{n}" for n in inner)


# -- 1. readers during saves --------------------------------------------------------------

_SAVER = """
    import sys, torch
    from meshplan.checkpoint import save_all
    from meshplan.layout import Mesh
    from meshplan.placement import Shard, Sharded, Spec, shard
    spec = Spec(Mesh.create(4), (Shard(0),), (64, 8), "float32")
    print("ready", flush=True)
    for k in range(int(sys.argv[2])):
        full = torch.full(spec.shape, float(k))
        save_all({{r: {{"w": Sharded(t, spec, r)}} for r, t in shard(full, spec).items()}},
                 sys.argv[1])
"""


def test_a_load_during_saves_gets_a_whole_committed_checkpoint(tmp_path):
    save_all(_states(-1), tmp_path)
    saver = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(_SAVER.format()), str(tmp_path), "60"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert saver.stdout.readline().strip() == "ready"
        seen, errors, deadline = set(), [], time.monotonic() + 40
        while saver.poll() is None and time.monotonic() < deadline:
            try:
                got = load_all(tmp_path, {"w": SPEC})
            except CheckpointError as e:
                errors.append(str(e))
                continue
            values = {float(v) for s in got.values() for v in s["w"].local.unique()}
            assert len(values) == 1, values  # never a mix of two checkpoints
            seen |= values
        assert not errors, (len(errors), errors[0])
        assert len(seen) > 3, seen  # the loads did overlap the saves
    finally:
        saver.kill()
        saver.wait()
    save_all(_states(7), tmp_path)
    assert _leftovers(tmp_path) == []  # readers leave no claims behind


def test_a_load_from_a_read_only_directory_works(tmp_path):
    save_all(_states(3), tmp_path)
    os.chmod(tmp_path, 0o555)
    try:
        got = load_all(tmp_path, {"w": SPEC})
    finally:
        os.chmod(tmp_path, 0o755)
    assert float(got[2]["w"].local[0, 0]) == 3.0


# -- 2. a failed save removes what it wrote -----------------------------------------------

_LIMITED = """
    import resource, signal, sys, torch
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails: EFBIG
    from meshplan.checkpoint import CheckpointError, save_all
    from meshplan.layout import Mesh
    from meshplan.placement import Shard, Sharded, Spec, shard
    spec = Spec(Mesh.create(4), (Shard(0),), {shape}, "float32")
    states = {{r: {{}} for r in range(4)}}
    for k in range({keys}):
        full = torch.full(spec.shape, float(k))
        for r, t in shard(full, spec).items():
            states[r][f"w{{k}}"] = Sharded(t, spec, r)
    resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, {limit}))
    try:
        save_all(states, sys.argv[1])
        print("saved")
    except CheckpointError as e:
        print("CheckpointError", e)
"""


@pytest.mark.parametrize(
    ("shape", "keys", "limit", "fails"),
    [((4096, 64), 1, 100_000, "shard file"), ((4, 2), 60, 16_000, "cannot commit")],
    ids=["shard-write", "index-write"],
)
def test_a_save_failing_on_a_full_disk_removes_its_files(tmp_path, shape, keys, limit, fails):
    save_all(_states(1), tmp_path)
    code = textwrap.dedent(_LIMITED.format(shape=shape, keys=keys, limit=limit))
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert out.stdout.startswith("CheckpointError") and fails in out.stdout, out
    assert _leftovers(tmp_path) == []
    got = load_all(tmp_path, {"w": SPEC})  # the previous checkpoint is intact
    assert float(got[0]["w"].local[0, 0]) == 1.0


# -- 8. a background save's relative path ---------------------------------------------------


def test_a_background_save_writes_where_its_relative_path_pointed_at_the_call(
    tmp_path, monkeypatch
):
    import meshplan.checkpoint._async as async_save

    real = async_save.save_sole

    def slow(state, directory):
        time.sleep(0.3)  # the caller changes directory meanwhile
        return real(state, directory)

    monkeypatch.setattr(async_save, "save_sole", slow)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    monkeypatch.chdir(tmp_path / "a")
    spec = Spec(Mesh.create(1), (Replicate(),), (3,), "int64")
    handle = save({"w": Sharded(torch.arange(3), spec, 0)}, "ckpt", blocking=False)
    os.chdir(tmp_path / "b")
    handle.wait()
    assert os.path.exists(tmp_path / "a" / "ckpt" / INDEX_NAME)
    assert not os.path.exists(tmp_path / "b" / "ckpt")
