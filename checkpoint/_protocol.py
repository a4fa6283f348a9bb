"""The commit protocol of a save: every writer's records, one index, one atomic commit.

A save writes, per writing rank, one new shard file (:mod:`._write`), gathers every
rank's chunk records, checks that they tile each tensor exactly once, and only then
replaces ``index.json`` in one atomic rename; files the new index does not name are
removed afterwards, under the directory's commit lock. A crash anywhere before that
rename leaves the previous checkpoint exactly as it was, and a save that raises removes
the files it wrote (unless the index it committed names them).

In one process (:func:`save_local`) the caller writes every rank's file itself; across
processes (:func:`save_distributed`) each rank writes its own, the records travel to
every rank, and the rank at mesh coordinate 0 commits. If a collective fails there (a
peer died or timed out), each surviving rank's error states whether the new checkpoint
was committed.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from typing import Any

from meshplan.errors import CheckpointError
from meshplan.placement import Sharded, Spec

from ._exchange import all_gather_small, broadcast_id, broadcast_result
from ._files import (
    STATE_DIR,
    commit_lock,
    discard_save,
    new_save_id,
    sweep_locked,
    wait_until_done,
)
from ._index import INDEX_NAME, ChunkRecord, Metadata, TensorMeta, check_tiles
from ._index_json import metadata_to_json, read_metadata
from ._ranks import check_whole_mesh
from ._write import Entry, check_state, claim, make_dir, owned, write_rank

__all__ = ["save_distributed", "save_local", "save_sole"]


def save_local(
    by_rank: Mapping[int, Mapping[str, Sharded]], directory: str, sole: bool
) -> Metadata:
    """Write every rank's file of ``by_rank`` ({rank: state}) from this process and
    commit; nothing is written unless the owned boxes tile every tensor."""
    _precheck(by_rank, sole)
    make_dir(directory)
    save_id = new_save_id()
    with claim(directory, save_id, "local"):
        try:
            written = [
                (rank, write_rank(state, rank, directory, save_id, sole))
                for rank, state in sorted(by_rank.items())
            ]
            meta = _assemble(written + _empty_keys(by_rank))
            _commit(directory, meta, save_id)
        except BaseException:
            discard_save(directory, save_id, by_rank)  # a failed save removes its files
            raise
    _sweep_after(directory)
    return meta


def _sweep_after(directory: str) -> None:
    """Sweep once this process's save is over (its claim released). A save that commits
    while an earlier one is still live keeps the earlier one's files (a live save's files
    are never swept), and that save, superseded, releases its claim after: without this,
    its files stayed until the next commit (three processes saving into one directory
    together: a superseded save's shard files left over)."""
    with contextlib.suppress(OSError), commit_lock(directory):
        sweep_locked(directory)


def save_sole(state: Mapping[str, Sharded], directory: str) -> Metadata:
    """Save ``state`` as its only writer: every box its values hold (which must cover each
    tensor: a replicated tensor, a one-rank mesh), from this one process."""
    check_state(state, None)
    by_rank: dict[int, dict[str, Sharded]] = {}
    for key, value in state.items():
        by_rank.setdefault(value.rank, {})[key] = value
    return save_local(by_rank, directory, sole=True)


def _empty_keys(by_rank: Mapping[int, Mapping[str, Sharded]]) -> list:
    # keys of empty tensors produce no chunk; they still belong in the index
    out = []
    for rank, state in by_rank.items():
        out.append((rank, []))
        for key, value in state.items():
            if value.spec.numel() == 0:
                out[-1][1].append((key, value.spec, None))
    return out


def _precheck(by_rank: Mapping[int, Mapping[str, Sharded]], sole: bool) -> None:
    """Before writing anything: every key's owned boxes must tile its tensor."""
    metas: dict[str, TensorMeta] = {}
    parts: dict[str, list[ChunkRecord]] = {}
    for rank, state in sorted(by_rank.items()):
        for key, value in state.items():
            spec = value.spec
            old = metas.get(key)
            if old is not None and (old.shape, old.dtype) != (spec.shape, spec.dtype):
                raise CheckpointError(
                    f"tensor {key!r}: ranks save different global tensors ({old.dtype}"
                    f"{list(old.shape)} and {spec.dtype}{list(spec.shape)}); one tensor per key",
                    value=key,
                )
            metas[key] = TensorMeta(key, spec.shape, spec.dtype, ())
            boxes = owned(spec, rank, sole)
            parts.setdefault(key, []).extend(
                ChunkRecord(b.chunk.offsets, b.chunk.sizes, f"rank {rank}", key, "") for b in boxes
            )
    for key, meta in metas.items():
        try:
            check_tiles(TensorMeta(key, meta.shape, meta.dtype, parts[key]))
        except CheckpointError as e:
            held = sorted(r for r, s in by_rank.items() if key in s)
            raise CheckpointError(
                f"{e}; this process holds tensor {key!r} only for ranks {held!r}: pass groups= "
                "to save from every rank, or save_all({rank: state, ...}) in one process",
                value=key,
            ) from None


def _assemble(records: list[tuple[int, list[Entry]]]) -> Metadata:
    """The index from every rank's records; raise when ranks disagree or leave gaps."""
    specs: dict[str, tuple[Spec, int]] = {}
    chunks: dict[str, list[ChunkRecord]] = {}
    for rank, entries in sorted(records, key=lambda item: item[0]):
        for key, spec, rec in entries:
            if key not in specs:
                specs[key] = (spec, rank)
                chunks[key] = []
            elif specs[key][0] != spec:
                s0, r0 = specs[key]
                what = (
                    "global tensor" if (s0.shape, s0.dtype) != (spec.shape, spec.dtype) else "spec"
                )
                raise CheckpointError(
                    f"tensor {key!r}: rank {r0} saves {s0} on {s0.mesh} but rank {rank} saves "
                    f"{spec} on {spec.mesh}; every rank must save one {what} per key",
                    value=key,
                )
            if rec is not None:  # None: an empty tensor, which has no chunks
                chunks[key].append(rec)
    tensors = {}
    for key, (spec, _) in specs.items():
        meta = TensorMeta(key, spec.shape, spec.dtype, chunks[key], spec)
        check_tiles(meta)
        tensors[key] = meta
    return Metadata(tensors)


def _commit(directory: str, meta: Metadata, save_id: str) -> None:
    """Atomically replace the index, then sweep files of dead saves the new index does
    not name, all under the directory's commit lock (see :mod:`._files`)."""
    final = os.path.join(directory, INDEX_NAME)
    tmp = os.path.join(directory, STATE_DIR, f"{save_id}.index.tmp")
    try:
        with commit_lock(directory):
            try:
                with open(tmp, "w", encoding="utf-8") as f:
                    f.write(metadata_to_json(meta))
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, final)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.remove(tmp)
                raise
            _fsync_dir(directory)
            sweep_locked(directory, frozenset(meta.files))
    except OSError as e:
        raise CheckpointError(f"cannot commit {final!r}: {e}", value=final) from None


def _fsync_dir(directory: str) -> None:
    with contextlib.suppress(OSError):  # not every platform opens directories
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def save_distributed(state: Mapping[str, Sharded], directory: str, groups: Any) -> Metadata | None:
    """Save this rank's ``state`` with every rank of ``groups.mesh`` (each calls it) and
    commit on the coordinator; the index, or None on a rank outside the mesh."""

    check_whole_mesh(groups.mesh)  # every rank sees this: no collective is left waiting
    group = groups.create(None)
    if group is None:
        # a rank outside the mesh: creating the mesh's group takes every rank of the
        # world (torch numbers groups in creation order), so it calls save too, and only
        # takes part in that
        return None
    rank = groups.rank
    coordinator = group.ranks[0]
    # Phase 0: one save id for every rank (it names the files and the claims).
    try:
        save_id = broadcast_id(new_save_id() if rank == coordinator else None, coordinator, group)
    except RuntimeError as e:  # a peer is gone or stuck: nothing is written yet
        raise _lost_peer(directory, rank, e, committed=False, when="before writing") from None
    with contextlib.ExitStack() as held:
        # Phase 1: every rank writes its own file under a fresh name (errors travel, no
        # hang); its claim keeps the file from any sweep until this save is over.
        outcome: tuple[str, Any]
        own_error: BaseException | None = None
        try:
            check_state(state, rank)
            make_dir(directory)
            held.enter_context(claim(directory, save_id, str(rank)))
            entries = write_rank(state, rank, directory, save_id)
            empties = [(k, v.spec, None) for k, v in state.items() if not v.spec.numel()]
            outcome = ("ok", entries + empties)
        except Exception as e:  # reported to every rank below
            outcome = ("error", f"{type(e).__name__}: {e}")
            own_error = e
        try:
            gathered = all_gather_small((rank, outcome), group)
        except RuntimeError as e:
            raise _resolve(directory, save_id, rank, coordinator, groups, e) from None
        failures = [(r, o[1]) for r, o in gathered if o[0] == "error"]
        if failures:
            discard_save(directory, save_id, [rank])
            if own_error is not None:
                raise own_error
            r, msg = min(failures)
            raise CheckpointError(
                f"save failed on rank {r}: {msg}; the previous checkpoint is kept"
            )
        # Phase 2: every rank checks the same records; the coordinator commits, then
        # tells all.
        result: list[Any] = [None]
        meta = None
        try:
            meta = _assemble([(r, o[1]) for r, o in gathered])
            if rank == coordinator:
                _commit(directory, meta, save_id)
            result[0] = "ok"
        except Exception as e:  # every rank must reach the broadcast below
            result[0] = str(e) if isinstance(e, CheckpointError) else f"{type(e).__name__}: {e}"
            own_error = e
        try:
            result[0] = broadcast_result(result[0], coordinator, group)
        except RuntimeError as e:
            raise _resolve(directory, save_id, rank, coordinator, groups, e) from None
        if own_error is not None or result[0] != "ok":
            discard_save(directory, save_id, [rank])  # unless the index names it
    if own_error is not None:
        raise own_error
    if result[0] != "ok":
        raise CheckpointError(f"commit on rank {coordinator} failed: {result[0]}")
    assert meta is not None
    return meta


def _lost_peer(
    directory: str, rank: int, exc: BaseException, committed: bool | None, when: str
) -> CheckpointError:
    """The error of a save whose collective failed (a peer died or timed out): what is on
    disk is stated, and kept as ``err.committed`` (True, False, or None if unknown)."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if committed:
        fate = (
            f"the new checkpoint IS committed ({INDEX_NAME} names this save's files): it "
            "is complete and loadable"
        )
    elif committed is None:
        fate = f"whether it committed is unknown: read {INDEX_NAME} (read_metadata) to see"
    else:
        fate = "it was not committed: the previous checkpoint is kept"
    err = CheckpointError(
        f"save to {directory!r}: a collective failed on rank {rank} {when} ({text}); "
        f"{fate}. A peer died or timed out: restart the job's processes",
        value=directory,
    )
    err.committed = committed  # type: ignore[attr-defined]
    return err


def _resolve(
    directory: str, save_id: str, rank: int, coordinator: int, groups: Any, exc: BaseException
) -> CheckpointError:
    """After a failed collective, find out whether this save committed: once the
    coordinator is done (its claim released: it returned, raised or died, so it will
    not commit later), the index on disk names this save's files or it does not."""
    if rank != coordinator:
        done = wait_until_done(directory, save_id, str(coordinator), groups.timeout + 30.0)
        if not done:
            return _lost_peer(directory, rank, exc, None, "while saving")
    try:
        on_disk = read_metadata(directory).files
    except CheckpointError:
        on_disk = ()
    committed = any(save_id in name for name in on_disk)
    if not committed:
        discard_save(directory, save_id, [rank])  # the coordinator is done: it never will
    return _lost_peer(directory, rank, exc, committed, "while saving")
