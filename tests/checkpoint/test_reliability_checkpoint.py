"""Regressions: concurrent saves never destroy a committed checkpoint, killed saves leave no
files behind once the next save commits, checksums bind a chunk to its place, and every
file of a checkpoint follows the umask."""

import json
import multiprocessing
import os
import signal
import stat
import time

import pytest
import torch

from meshplan.checkpoint import INDEX_NAME, CheckpointError, load_all, read_metadata, save_all
from meshplan.layout import Mesh
from meshplan.placement import Shard, Sharded, Spec, shard

MESH = Mesh.create(4)
SPEC = Spec(MESH, (Shard(0),), (4096, 64), "float32")


def _states(value):
    full = torch.full(SPEC.shape, float(value))
    return {r: {"w": Sharded(t, SPEC, r)} for r, t in shard(full, SPEC).items()}


def _value(path):
    got = load_all(path, {"w": SPEC})  # verify=True: every chunk's checksum
    values = {float(v) for s in got.values() for v in s["w"].local.unique()}
    assert len(values) == 1, values
    return values.pop()


def _leftovers(path):
    """Files in the checkpoint directory that belong to no committed checkpoint."""
    names = set(os.listdir(path)) - {INDEX_NAME, ".meshplan", *read_metadata(path).files}
    state = os.path.join(path, ".meshplan")
    inner = set(os.listdir(state)) - {"commit.lock"} if os.path.isdir(state) else set()
    return sorted(names) + sorted(f".meshplan/{n}" for n in inner)


def test_a_save_superseded_while_it_was_live_leaves_no_files(tmp_path, monkeypatch):
    # save A commits; save B commits while A still holds its claim (B's sweep keeps a live
    # save's files); A ends after: its files, superseded, are swept once its claim is
    # released (they were left until the next commit: the concurrent-saves test below
    # found them under load)
    from meshplan.checkpoint import _protocol

    real = _protocol._commit
    nested = []

    def commit(directory, meta, save_id):
        real(directory, meta, save_id)
        if not nested:  # A has committed and is still live: B saves now
            nested.append(save_id)
            save_all(_states(2), directory)

    monkeypatch.setattr(_protocol, "_commit", commit)
    save_all(_states(1), tmp_path)
    assert nested
    assert _value(tmp_path) == 2  # B committed last
    assert _leftovers(tmp_path) == []


# -- 1. concurrent saves ------------------------------------------------------------------


def _saver(path, who, rounds, barrier, errors):
    for k in range(rounds):
        barrier.wait()  # every saver starts together
        try:
            save_all(_states(who * 1000 + k), path)
        except Exception as e:  # reported to the parent
            errors.put((who, k, repr(e)))
        barrier.wait()  # the parent checks the directory


def test_concurrent_saves_into_one_directory_leave_a_complete_checkpoint(tmp_path):
    savers, rounds = 3, 8
    save_all(_states(-1), tmp_path)
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(savers + 1)
    errors = ctx.Queue()
    procs = [
        ctx.Process(target=_saver, args=(str(tmp_path), who, rounds, barrier, errors))
        for who in range(savers)
    ]
    for p in procs:
        p.start()
    try:
        for k in range(rounds):
            barrier.wait(timeout=120)
            barrier.wait(timeout=120)
            # the last commit wins, complete and verified; nobody failed
            assert _value(tmp_path) in {who * 1000 + k for who in range(savers)}, k
            assert errors.empty(), errors.get()
            assert _leftovers(tmp_path) == []
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()


def test_a_running_save_keeps_its_files_while_another_commits(tmp_path, monkeypatch):
    import meshplan.checkpoint._protocol as protocol

    save_all(_states(1), tmp_path)
    real_commit = protocol._commit
    inner = []

    def commit_after_another_save(directory, meta, save_id):
        # this save has written its files; another one commits meanwhile
        if not inner:
            inner.append(save_id)
            save_all(_states(2), directory)
        real_commit(directory, meta, save_id)

    monkeypatch.setattr(protocol, "_commit", commit_after_another_save)
    save_all(_states(3), tmp_path)
    monkeypatch.undo()
    assert _value(tmp_path) == 3  # the last commit wins, and its files survived the other
    assert _leftovers(tmp_path) == []


# -- 2. killed saves ----------------------------------------------------------------------

BIG = Spec(Mesh.create(2), (Shard(0),), (4, 2**22), "float32")  # 32 MiB per rank


def _save_forever(path, started):
    states = {r: {"w": Sharded(t, BIG, r)} for r, t in shard(torch.ones(BIG.shape), BIG).items()}
    while True:
        save_all(states, path)
        started.set()


@pytest.mark.parametrize("trials", [4])
def test_killed_saves_leave_no_files_after_the_next_save(tmp_path, trials):
    ctx = multiprocessing.get_context("spawn")
    for k in range(trials):
        started = ctx.Event()
        proc = ctx.Process(target=_save_forever, args=(str(tmp_path), started))
        proc.start()
        assert started.wait(120)
        time.sleep(0.05 + 0.11 * k)  # somewhere inside a later save (mostly writing)
        os.kill(proc.pid, signal.SIGKILL)
        proc.join()
    full = torch.full(BIG.shape, 5.0)
    save_all({r: {"w": Sharded(t, BIG, r)} for r, t in shard(full, BIG).items()}, tmp_path)
    assert _leftovers(tmp_path) == []
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".tmp")]


# -- 5. checksums bind bytes to places ----------------------------------------------------


def _swap(path, field):
    index = os.path.join(path, INDEX_NAME)
    with open(index) as f:
        doc = json.load(f)
    a, b = doc["tensors"]["w"]["chunks"][:2]
    for name in field:
        a[name], b[name] = b[name], a[name]
    with open(index, "w") as f:
        json.dump(doc, f)


@pytest.mark.parametrize(
    "field", [("offsets",), ("file", "name"), ("offsets", "checksum")], ids=str
)
def test_a_tampered_index_fails_verification(tmp_path, field):
    spec = Spec(Mesh.create(2), (Shard(0),), (4,), "int64")
    save_all({r: {"w": Sharded(t, spec, r)} for r, t in shard(torch.arange(4), spec).items()},
             tmp_path)
    _swap(tmp_path, field)
    with pytest.raises(CheckpointError, match="corrupt"):
        load_all(tmp_path, {"w": spec})


def test_an_index_with_byte_only_checksums_still_loads(tmp_path):
    from meshplan.checkpoint import checksum

    spec = Spec(Mesh.create(2), (Shard(0),), (4,), "int64")
    save_all({r: {"w": Sharded(t, spec, r)} for r, t in shard(torch.arange(4), spec).items()},
             tmp_path)
    index = os.path.join(tmp_path, INDEX_NAME)
    with open(index) as f:
        doc = json.load(f)
    chunks = doc["tensors"]["w"]["chunks"]
    for c, part in zip(chunks, (torch.arange(2), torch.arange(2, 4)), strict=True):
        c["checksum"] = checksum(part)  # an index of an earlier meshplan
    with open(index, "w") as f:
        json.dump(doc, f)
    got = load_all(tmp_path, {"w": spec})
    assert torch.equal(torch.cat([got[0]["w"].local, got[1]["w"].local]), torch.arange(4))


# -- 13. permissions ----------------------------------------------------------------------


@pytest.mark.parametrize("mask", [0o022, 0o077, 0o002])
def test_every_file_of_a_checkpoint_follows_the_umask(tmp_path, mask):
    old = os.umask(mask)
    try:
        save_all(_states(1), tmp_path)
    finally:
        os.umask(old)
    names = [INDEX_NAME, *read_metadata(tmp_path).files]
    modes = {n: stat.S_IMODE(os.stat(tmp_path / n).st_mode) for n in names}
    assert set(modes.values()) == {0o666 & ~mask}, modes
