"""Saving and loading sharded tensors: safetensors shard files plus an atomic JSON index.

The shell of :mod:`meshplan.checkpoint`. A save writes, per writing rank, one new
safetensors file under a fresh name (so the files of the committed checkpoint are never
touched), waits for every rank, and only then replaces ``index.json`` in one atomic
rename; files the new index does not name are removed afterwards. A crash anywhere
before that rename leaves the previous checkpoint exactly as it was.

A load reads the index, intersects the target rank's boxes with the saved chunks
(:func:`~meshplan.checkpoint.plan_reads`) and copies only the overlapping parts; with
``verify=True`` (the default) every chunk it touches is read whole once and its checksum
checked, with ``verify=False`` only the needed slices are read.
"""

from __future__ import annotations

import contextlib
import os
import zlib
from collections.abc import Iterator, Mapping
from typing import Any

import torch

from meshplan.errors import CheckpointError
from meshplan.layout._ints import as_bool, as_int
from meshplan.layout._mesh import first_instance
from meshplan.placement import Sharded, Spec, local_shape
from meshplan.placement._tensor import partial_keeps

from ._files import (
    STATE_DIR,
    Claim,
    commit_lock,
    new_save_id,
    shard_name,
    sweep_locked,
    wait_until_done,
    write_safetensors,
)
from ._index import (
    INDEX_NAME,
    ChunkRecord,
    Metadata,
    TensorMeta,
    check_tiles,
    checkpoint_path,
    metadata_to_json,
    missing_tensor,
    read_metadata,
)
from ._plan import check_target, local_boxes, plan_reads, writes

__all__ = ["checksum", "load", "load_all", "save", "save_all"]


def checksum(
    tensor: torch.Tensor, *, key: str | None = None, offsets: tuple[int, ...] | None = None
) -> str:
    """``"crc32:<hex>"`` of a tensor's bytes in row-major order (any dtype); with ``key``
    and ``offsets``, ``"crc32+box:<hex>"``, which also covers the chunk's place: the
    tensor's name, the box's global offsets and its sizes (what a save records, so an
    index whose records were swapped or moved fails verification).

    >>> checksum(torch.zeros(2, dtype=torch.int32))
    'crc32:6522df69'
    >>> t = torch.arange(2)
    >>> checksum(t, key="w", offsets=(0,)) != checksum(t, key="w", offsets=(2,))
    True
    """
    if not isinstance(tensor, torch.Tensor):
        raise CheckpointError(
            f"checksum needs a torch.Tensor, got {type(tensor).__name__} {tensor!r:.80}; "
            "convert it first (e.g. torch.from_numpy)",
            value=tensor,
        )
    if tensor.is_meta:
        raise CheckpointError(
            "checksum of a meta-device tensor: it holds no data; materialize it first",
            value=tensor,
        )
    seed = 0
    if key is not None or offsets is not None:
        if not isinstance(key, str) or offsets is None:
            raise CheckpointError(
                f"checksum(key={key!r}, offsets={offsets!r}): a chunk's place is its tensor "
                "name (a str) and its global offsets; pass both or neither",
                value=key,
            )
        place = f"{key}\0{[int(o) for o in offsets]}\0{list(tensor.shape)}\0"
        seed = zlib.crc32(place.encode("utf-8"))
    flat = tensor.detach().contiguous().reshape(-1)
    crc = seed
    if flat.numel():
        crc = zlib.crc32(memoryview(flat.view(torch.uint8).cpu().numpy()), seed)
    return f"crc32+box:{crc:08x}" if key is not None else f"crc32:{crc:08x}"


def _recorded_checksum(tensor: torch.Tensor, meta: TensorMeta, rec: ChunkRecord) -> str:
    """The checksum of a chunk read back, in the scheme its record uses."""
    if rec.checksum.startswith("crc32+box:"):
        return checksum(tensor, key=meta.key, offsets=rec.offsets)
    return checksum(tensor)  # an index written before checksums covered places


# -- saving -------------------------------------------------------------------------------


_Entry = tuple[str, Spec, "ChunkRecord | None"]  # key, the spec it is saved in, chunk


def _check_state(state: Any, rank: int | None) -> None:
    if not isinstance(state, Mapping):
        raise CheckpointError(
            f"a checkpoint state must map names to Sharded values, got {type(state)!r}",
            value=state,
        )
    for key, value in state.items():
        if not isinstance(key, str) or not key or "#" in key:
            raise CheckpointError(
                f"state key {key!r} must be a non-empty string without '#'", value=key
            )
        if not isinstance(value, Sharded):
            raise CheckpointError(
                f"state[{key!r}] is {type(value).__name__}, not a Sharded; wrap local tensors "
                "with meshplan.placement.Sharded(local, spec, rank)",
                value=value,
            )
        if value.local.is_meta:
            raise CheckpointError(
                f"state[{key!r}] is a meta-device tensor: it holds no data to save; "
                "materialize it first (e.g. module.to_empty(device=...) and initialize it)",
                value=key,
            )
        if rank is not None and value.rank != rank:
            raise CheckpointError(
                f"state[{key!r}] belongs to rank {value.rank}, but it is saved as rank {rank}'s",
                value=value,
            )
        if value.spec.is_partial:
            raise CheckpointError(
                f"state[{key!r}] is partial ({value.spec}): its value is not held by any rank; "
                "redistribute it to Replicate/Shard placements (a reduction) before saving",
                value=key,
            )


def _make_dir(directory: str) -> None:
    """Create the checkpoint directory (and its parents) unless it exists."""
    if os.path.exists(directory) and not os.path.isdir(directory):
        raise CheckpointError(
            f"checkpoint path {directory!r} is a file, not a directory; pass a directory "
            "(a new one, or one holding a checkpoint)",
            value=directory,
        )
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as e:
        raise CheckpointError(
            f"cannot create the checkpoint directory {directory!r}: {e}; pass a path you can "
            "write to",
            value=directory,
        ) from None


def _check_groups(groups: Any) -> None:
    from meshplan.runtime import ProcessGroups

    if not isinstance(groups, ProcessGroups):
        raise CheckpointError(
            f"groups={groups!r:.80} must be a meshplan.runtime.ProcessGroups built on the "
            "mesh (ProcessGroups(mesh)), or None",
            value=groups,
        )


def _fsync_dir(directory: str) -> None:
    with contextlib.suppress(OSError):  # not every platform opens directories
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _owned(spec: Spec, rank: int, sole: bool):
    # sole: the caller is the only writer of this tensor, so it writes every box it holds
    return local_boxes(spec, rank) if sole or writes(spec, rank) else ()


def _write_rank(
    entries: Mapping[str, Sharded], rank: int, directory: str, save_id: str, sole: bool = False
) -> list[_Entry]:
    """Write rank ``rank``'s owned boxes into one new file; return (key, spec, record)."""
    file = shard_name(rank, save_id)
    tensors: dict[str, torch.Tensor] = {}
    spans: dict[int, list[tuple[int, int]]] = {}  # storage -> byte ranges of its pieces
    out = []
    owned = []
    for key in sorted(entries):
        value = entries[key]
        local = value.local.detach()
        for i, box in enumerate(_owned(value.spec, rank, sole)):
            piece = local
            for d, (lo, n) in enumerate(zip(box.local_offsets, box.chunk.sizes, strict=True)):
                if n != local.shape[d]:
                    piece = piece.narrow(d, lo, n)
            owned.append((key, value.spec, i, box, piece))
    for (key, spec, i, box, _), piece in zip(owned, _to_host([o[4] for o in owned]), strict=True):
        piece = _unshared(piece, spans)
        name = f"{key}#{i}"
        tensors[name] = _stored(piece)
        digest = checksum(piece, key=key, offsets=box.chunk.offsets)
        record = ChunkRecord(box.chunk.offsets, box.chunk.sizes, file, name, digest)
        out.append((key, spec, record))
    if not tensors:
        return out
    final = os.path.join(directory, file)
    tmp = os.path.join(directory, STATE_DIR, f"{save_id}-{rank}.tmp")
    try:
        write_safetensors(tensors, tmp, {"format": "pt", "rank": str(rank)})
        os.replace(tmp, final)
    except OSError as e:
        raise CheckpointError(f"cannot write shard file {final!r}: {e}", value=final) from None
    return out


def _to_host(pieces: list[torch.Tensor]) -> list[torch.Tensor]:
    """Contiguous CPU copies of ``pieces`` (CPU pieces copied only when not contiguous).

    Pieces on an accelerator are copied into pinned host buffers, all queued at once
    (``non_blocking``: the copies overlap each other and the device's queued work), then
    waited for once: one synchronization per file instead of one blocking pageable copy
    per box.
    """
    out: list[torch.Tensor] = []
    devices = set()
    for piece in pieces:
        if piece.device.type == "cpu":
            out.append(piece.contiguous())
            continue
        host = torch.empty(piece.shape, dtype=piece.dtype, pin_memory=True)
        host.copy_(piece, non_blocking=True)
        devices.add(piece.device)
        out.append(host)
    for device in devices:  # the host buffers are complete once the device is done
        getattr(torch, device.type).synchronize(device)
    return out


def _unshared(piece: torch.Tensor, spans: dict[int, list[tuple[int, int]]]) -> torch.Tensor:
    """``piece``, or a copy of it when its bytes overlap a piece kept before (one tensor
    under two keys: tied weights; safetensors refuses tensors that share memory).
    ``spans`` holds, per storage, the byte ranges of the pieces kept so far."""
    if not piece.numel():
        return piece
    start = piece.data_ptr()
    stop = start + piece.numel() * piece.element_size()
    kept = spans.setdefault(piece.untyped_storage().data_ptr(), [])
    if any(a < stop and start < b for a, b in kept):
        return piece.clone()  # a storage of its own, which nothing else shares
    kept.append((start, stop))
    return piece


# dtypes safetensors cannot hold, stored as their real view (same bytes, a trailing dim of 2)
_REAL_VIEW = {torch.complex128: torch.float64}


def _stored(piece: torch.Tensor) -> torch.Tensor:
    return torch.view_as_real(piece) if piece.dtype in _REAL_VIEW else piece


def _restored(tensor: torch.Tensor, meta: TensorMeta) -> torch.Tensor:
    """A chunk read back in the index's dtype (undoing :func:`_stored`)."""
    dtype = getattr(torch, meta.dtype)
    if _REAL_VIEW.get(dtype) == tensor.dtype and tensor.dim() and tensor.shape[-1] == 2:
        return torch.view_as_complex(tensor.contiguous())
    return tensor


def _assemble(records: list[tuple[int, list[_Entry]]]) -> Metadata:
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
            with open(tmp, "w", encoding="utf-8") as f:
                f.write(metadata_to_json(meta))
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, final)
            _fsync_dir(directory)
            sweep_locked(directory, frozenset(meta.files))
    except OSError as e:
        raise CheckpointError(f"cannot commit {final!r}: {e}", value=final) from None


def _save_local(
    by_rank: Mapping[int, Mapping[str, Sharded]], directory: str, sole: bool
) -> Metadata:
    _precheck(by_rank, sole)
    _make_dir(directory)
    save_id = new_save_id()
    with _claim(directory, save_id, "local"):
        written = [
            (rank, _write_rank(state, rank, directory, save_id, sole))
            for rank, state in sorted(by_rank.items())
        ]
        meta = _assemble(written + _empty_keys(by_rank))
        _commit(directory, meta, save_id)
    return meta


@contextlib.contextmanager
def _claim(directory: str, save_id: str, tag: str) -> Iterator[Claim]:
    """Hold a claim of save ``save_id`` (its files are then never swept)."""
    try:
        claim = Claim(directory, save_id, tag).__enter__()
    except OSError as e:
        raise CheckpointError(
            f"cannot mark a save in {directory!r} ({e}); pass a directory you can write to",
            value=directory,
        ) from None
    try:
        yield claim
    finally:
        claim.__exit__(None, None, None)


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
            boxes = _owned(spec, rank, sole)
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


def save(
    state: Mapping[str, Sharded],
    path: str | os.PathLike[str],
    groups: Any = None,
    *,
    blocking: bool = True,
) -> Any:
    """Save one rank's sharded tensors to the checkpoint directory ``path``; return its index.

    With ``blocking=False`` it returns once this rank's boxes are copied to CPU buffers,
    with a :class:`~meshplan.checkpoint.SaveHandle` whose ``wait()`` gives the index: the
    write and the commit run in the background, on a process group of their own (see
    :func:`~meshplan.checkpoint.save_async`).

    With ``groups`` (a :class:`~meshplan.runtime.ProcessGroups`), every rank of
    ``groups.mesh`` calls ``save`` with its own state; each writes only the boxes it owns
    (one writer per replica), all wait for each other, and the rank at mesh coordinate 0
    commits the index. On a mesh over part of the world the other ranks call ``save``
    too (with any state, e.g. ``{}``): they only take part in creating the mesh's process
    group, as every rank must in torch, and get None. Without ``groups`` the calling
    process is the only writer: it writes every box its values hold, which must cover
    each tensor (a replicated tensor, a one-rank mesh); use :func:`save_all` for all ranks
    of a mesh in one process. Partial values are refused (reduce them first). Shard files are safetensors, one per writing rank;
    every chunk records a crc32 checksum of its bytes and its place (tensor name, box).

    Saves into one directory may run at once (several jobs, or a retry racing a slow
    save): each commits a complete checkpoint atomically and the last commit wins; no
    save removes a file of the committed checkpoint or of another save still running,
    and files of killed saves are swept by the next commit (see
    :mod:`meshplan.checkpoint._files`). If a collective fails mid-save (a peer died or
    timed out), every surviving rank raises a :class:`CheckpointError` whose
    ``committed`` attribute says what is on disk: True when the new checkpoint was
    committed, False when the previous one is kept.

    >>> import tempfile
    >>> from meshplan.layout import Mesh
    >>> from meshplan.placement import Replicate
    >>> spec = Spec(Mesh.create(2), (Replicate(),), (3,), "int64")
    >>> path = tempfile.mkdtemp()
    >>> meta = save({"w": Sharded(torch.arange(3), spec, 0)}, path)
    >>> meta["w"].chunks[0].offsets, meta["w"].chunks[0].sizes
    ((0,), (3,))
    >>> load(path, {"w": spec}, rank=1)["w"].local
    tensor([0, 1, 2])
    """
    flag = as_bool(blocking)
    if flag is None:
        raise CheckpointError(
            f"blocking must be True or False, got {blocking!r}; pass blocking=False for a "
            "save that overlaps the next steps",
            value=blocking,
        )
    if not flag:
        from ._async import save_async

        return save_async(state, path, groups)
    directory = checkpoint_path(path)
    if groups is None:
        _check_state(state, None)
        by_rank: dict[int, dict[str, Sharded]] = {}
        for key, value in state.items():
            by_rank.setdefault(value.rank, {})[key] = value
        return _save_local(by_rank, directory, sole=True)
    _check_groups(groups)
    return _save_distributed(state, directory, groups)


def save_all(states: Mapping[int, Mapping[str, Sharded]], path: str | os.PathLike[str]) -> Metadata:
    """Save every rank's state from one process: ``{rank: {key: Sharded}}``; return the index.

    The same files and index as a multi-process :func:`save`.

    >>> import tempfile
    >>> from meshplan.layout import Mesh
    >>> from meshplan.placement import Shard, shard
    >>> spec = Spec(Mesh.create(2), (Shard(0),), (4,), "int64")
    >>> states = {r: {"w": Sharded(t, spec, r)} for r, t in shard(torch.arange(4), spec).items()}
    >>> path = tempfile.mkdtemp()
    >>> len(save_all(states, path)["w"].chunks)
    2
    """
    if not isinstance(states, Mapping):
        raise CheckpointError(
            f"save_all needs a mapping rank -> state, got {type(states)!r}", value=states
        )
    directory = checkpoint_path(path)
    for rank, state in states.items():
        _check_state(state, rank)
    return _save_local({r: dict(s) for r, s in states.items()}, directory, sole=False)


def _save_distributed(state: Mapping[str, Sharded], directory: str, groups: Any) -> Metadata | None:
    import torch.distributed as dist

    mesh = groups.mesh
    if mesh.size() != mesh.world_size:  # every rank sees this: no collective is left waiting
        raise CheckpointError(
            f"save needs ProcessGroups over a whole mesh, got one over the sliced mesh {mesh} "
            "(several instances would each commit); build ProcessGroups on the root mesh",
            value=mesh,
        )
    group = groups.create(None)
    if group is None:
        # a rank outside the mesh: creating the mesh's group takes every rank of the
        # world (torch numbers groups in creation order), so it calls save too, and only
        # takes part in that
        return None
    rank = groups.rank
    coordinator = group.ranks[0]
    # Phase 0: one save id for every rank (it names the files and the claims).
    ids: list[Any] = [new_save_id() if rank == coordinator else None]
    try:
        dist.broadcast_object_list(ids, src=coordinator, group=group.pg)
    except RuntimeError as e:  # a peer is gone or stuck: nothing is written yet
        raise _lost_peer(directory, rank, e, committed=False, when="before writing") from None
    save_id = ids[0]
    with contextlib.ExitStack() as held:
        # Phase 1: every rank writes its own file under a fresh name (errors travel, no
        # hang); its claim keeps the file from any sweep until this save is over.
        outcome: tuple[str, Any]
        own_error: BaseException | None = None
        try:
            _check_state(state, rank)
            _make_dir(directory)
            held.enter_context(_claim(directory, save_id, str(rank)))
            entries = _write_rank(state, rank, directory, save_id)
            empties = [(k, v.spec, None) for k, v in state.items() if not v.spec.numel()]
            outcome = ("ok", entries + empties)
        except Exception as e:  # reported to every rank below
            outcome = ("error", f"{type(e).__name__}: {e}")
            own_error = e
        gathered: list[Any] = [None] * group.size
        try:
            dist.all_gather_object(gathered, (rank, outcome), group=group.pg)
        except RuntimeError as e:
            raise _resolve(directory, save_id, rank, coordinator, groups, e) from None
        failures = [(r, o[1]) for r, o in gathered if o[0] == "error"]
        if failures:
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
            dist.broadcast_object_list(result, src=coordinator, group=group.pg)
        except RuntimeError as e:
            raise _resolve(directory, save_id, rank, coordinator, groups, e) from None
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
    return _lost_peer(directory, rank, exc, committed, "while saving")


# -- loading ------------------------------------------------------------------------------


class _Reader:
    """Open shard files lazily; hand out verified chunks or raw slices."""

    def __init__(self, directory: str, verify: bool) -> None:
        self.directory = directory
        self.verify = verify
        self.stack = contextlib.ExitStack()
        self.handles: dict[str, Any] = {}
        self.cache: dict[tuple[str, str], torch.Tensor] = {}

    def close(self) -> None:
        self.cache.clear()
        self.stack.close()

    def _open(self, meta: TensorMeta, rec: ChunkRecord) -> Any:
        from safetensors import safe_open

        handle = self.handles.get(rec.file)
        if handle is None:
            full = os.path.join(self.directory, rec.file)
            if not os.path.exists(full):
                raise CheckpointError(
                    f"shard file {rec.file!r} of tensor {meta.key!r} is missing from "
                    f"{self.directory!r}; the checkpoint is incomplete",
                    value=rec.file,
                )
            try:
                handle = self.stack.enter_context(safe_open(full, framework="pt", device="cpu"))
            except Exception as e:  # safetensors raises its own error types
                raise CheckpointError(
                    f"shard file {rec.file!r} (tensor {meta.key!r}) is not readable "
                    f"safetensors: {e}",
                    value=rec.file,
                ) from None
            self.handles[rec.file] = handle
        return handle

    def _whole(self, meta: TensorMeta, rec: ChunkRecord) -> torch.Tensor:
        cached = self.cache.get((rec.file, rec.name))
        if cached is not None:
            return cached
        handle = self._open(meta, rec)
        try:
            tensor = handle.get_tensor(rec.name)
        except Exception as e:
            raise CheckpointError(
                f"chunk {rec.name!r} of tensor {meta.key!r} cannot be read from {rec.file!r}: {e}",
                value=rec.file,
            ) from None
        tensor = _restored(tensor, meta)
        self._check_form(meta, rec, tuple(tensor.shape), tensor.dtype)
        got = _recorded_checksum(tensor, meta, rec)
        if got != rec.checksum:
            raise CheckpointError(
                f"chunk {rec.name!r} of tensor {meta.key!r} in {rec.file!r} is corrupt: checksum "
                f"{got} != {rec.checksum} recorded in the index",
                value=rec.file,
            )
        self.cache[(rec.file, rec.name)] = tensor
        return tensor

    def _check_form(
        self, meta: TensorMeta, rec: ChunkRecord, shape: tuple[int, ...], dtype: torch.dtype
    ) -> None:
        if shape != rec.sizes or dtype != getattr(torch, meta.dtype):
            raise CheckpointError(
                f"chunk {rec.name!r} of tensor {meta.key!r} in {rec.file!r} holds "
                f"{str(dtype).removeprefix('torch.')}{list(shape)}, but the index says "
                f"{meta.dtype}{list(rec.sizes)}; the checkpoint is damaged",
                value=rec.file,
            )

    def piece(self, meta: TensorMeta, rec: ChunkRecord, offsets, sizes) -> torch.Tensor:
        index = tuple(slice(o, o + n) for o, n in zip(offsets, sizes, strict=True))
        if self.verify or not index:
            return self._whole(meta, rec)[index]
        handle = self._open(meta, rec)
        try:
            view = handle.get_slice(rec.name)
            shape = tuple(view.get_shape())
            if getattr(torch, meta.dtype) in _REAL_VIEW:
                shape = shape[:-1] if shape[-1:] == (2,) else shape + (0,)
            if shape != rec.sizes:
                self._check_form(meta, rec, shape, getattr(torch, meta.dtype))
            return _restored(view[index], meta)
        except CheckpointError:
            raise
        except Exception as e:
            raise CheckpointError(
                f"chunk {rec.name!r} of tensor {meta.key!r} cannot be read from {rec.file!r}: {e}",
                value=rec.file,
            ) from None

    def forget(self) -> None:
        self.cache.clear()


def _load_one(reader: _Reader, meta: TensorMeta, spec: Spec, rank: int) -> Sharded:
    dtype = getattr(torch, spec.dtype)
    shape = local_shape(spec, rank)
    if spec.is_partial and not partial_keeps(spec, spec.mesh.coordinate(rank)):
        return Sharded(torch.zeros(shape, dtype=dtype), spec, rank)
    local = torch.empty(shape, dtype=dtype)
    for read in plan_reads(meta, spec, rank):
        rec = meta.chunks[read.chunk]
        src = reader.piece(meta, rec, read.source.offsets, read.source.sizes)
        if src.dtype != dtype or tuple(src.shape) != read.source.sizes:
            reader._check_form(meta, rec, tuple(src.shape), src.dtype)
        index = tuple(
            slice(o, o + n) for o, n in zip(read.target.offsets, read.target.sizes, strict=True)
        )
        local[index] = src
    return Sharded(local, spec, rank)


def _on_device(value: Sharded, device: Any) -> Sharded:
    if device is None:
        return value
    try:
        return value.with_local(value.local.to(device))
    except (RuntimeError, TypeError, AssertionError) as e:
        raise CheckpointError(
            f"cannot place the loaded tensors on device={device!r}: {e}; pass a device "
            "this process has (e.g. 'cpu', or 'cuda' after torch.cuda.set_device)",
            value=device,
        ) from None


def _check_targets(targets: Any, meta: Metadata, directory: str) -> None:
    if not isinstance(targets, Mapping):
        raise CheckpointError(
            f"targets must map tensor names to Specs, got {type(targets)!r}", value=targets
        )
    for key, spec in targets.items():
        if key not in meta.tensors:
            raise missing_tensor(key, meta.tensors, f" at {directory!r}")
        check_target(meta.tensors[key], spec, repr(directory))


def _resolve_rank(targets: Mapping[str, Spec], groups: Any, rank: Any) -> int:
    if groups is not None:
        _check_groups(groups)
    if rank is not None:
        given = rank
        rank = as_int(given)
        if rank is None:
            raise CheckpointError(
                f"rank={given!r} must be an int: the global rank to load for", value=given
            )
        if groups is not None and groups.rank != rank:
            raise CheckpointError(
                f"rank={rank!r} disagrees with groups (rank {groups.rank}); pass one of them",
                value=rank,
            )
        return rank
    if groups is not None:
        return groups.rank
    sizes = {spec.mesh.size() for spec in targets.values()}
    if sizes <= {1}:
        return next((spec.mesh.ranks[0] for spec in targets.values()), 0)
    raise CheckpointError(
        "load needs to know which rank it loads for: pass groups= (ProcessGroups) or rank=; "
        "load_all loads every rank in one process",
    )


def _verify_flag(verify: Any) -> bool:
    flag = as_bool(verify)
    if flag is None:
        raise CheckpointError(
            f"verify must be True or False, got {verify!r}; pass verify=False to skip the "
            "checksums",
            value=verify,
        )
    return flag


def load(
    path: str | os.PathLike[str],
    targets: Mapping[str, Spec],
    groups: Any = None,
    *,
    rank: int | None = None,
    verify: bool = True,
    device: str | torch.device | None = None,
) -> dict[str, Sharded]:
    """Load the calling rank's part of each tensor, resharded to its target spec.

    ``targets`` maps tensor names to the specs to load them as: any mesh, world size,
    placements, shard order or StridedShard, as long as the global shape and dtype are
    the saved ones (Partial targets get meshplan's canonical split). The rank comes
    from ``groups`` (a :class:`~meshplan.runtime.ProcessGroups`) or ``rank=``; no
    collective runs. Only chunks overlapping this rank's boxes are read; with ``verify``
    each is read whole once and its checksum checked. ``device`` places the local
    tensors (default: the CPU; e.g. ``"cuda"`` for a training loop on NCCL).

    >>> import tempfile
    >>> from meshplan.layout import Mesh
    >>> from meshplan.placement import Replicate, Shard
    >>> path = tempfile.mkdtemp()
    >>> one = Spec(Mesh.create(1), (Replicate(),), (2, 3), "int64")
    >>> _ = save({"w": Sharded(torch.arange(6).reshape(2, 3), one, 0)}, path)
    >>> load(path, {"w": Spec(Mesh.create(3), (Shard(1),), (2, 3), "int64")}, rank=2)["w"].local
    tensor([[2],
            [5]])
    """
    verify = _verify_flag(verify)
    directory = checkpoint_path(path)
    meta = read_metadata(directory)
    _check_targets(targets, meta, directory)
    rank = _resolve_rank(targets, groups, rank)
    reader = _Reader(directory, verify)
    try:
        out = {}
        for key, spec in targets.items():
            if not spec.mesh.contains(rank):
                raise CheckpointError(
                    f"rank {rank} is not in the mesh of target {key!r} ({spec.mesh}); load "
                    "only the tensors whose mesh holds this rank",
                    value=key,
                )
            out[key] = _on_device(_load_one(reader, meta.tensors[key], spec, rank), device)
            reader.forget()
        return out
    finally:
        reader.close()


def load_all(
    path: str | os.PathLike[str],
    targets: Mapping[str, Spec],
    *,
    verify: bool = True,
    device: str | torch.device | None = None,
) -> dict[int, dict[str, Sharded]]:
    """Load every rank's part in one process: ``{rank: {key: Sharded}}`` (on ``device``).

    Ranks are those of each target's mesh (the first instance of a sliced mesh); each
    saved chunk is read (and verified) once per tensor, whatever the number of ranks.

    >>> import tempfile
    >>> from meshplan.layout import Mesh
    >>> from meshplan.placement import Replicate, StridedShard
    >>> path = tempfile.mkdtemp()
    >>> one = Spec(Mesh.create(1), (Replicate(),), (4,), "int64")
    >>> _ = save({"w": Sharded(torch.arange(4), one, 0)}, path)
    >>> got = load_all(path, {"w": Spec(Mesh.create(2), (StridedShard(0, 2),), (4,), "int64")})
    >>> got[0]["w"].local, got[1]["w"].local
    (tensor([0, 2]), tensor([1, 3]))
    """
    verify = _verify_flag(verify)
    directory = checkpoint_path(path)
    meta = read_metadata(directory)
    _check_targets(targets, meta, directory)
    reader = _Reader(directory, verify)
    out: dict[int, dict[str, Sharded]] = {}
    try:
        for key, spec in targets.items():
            mesh = spec.mesh
            first = first_instance(mesh)
            for rank in first:
                one = _load_one(reader, meta.tensors[key], spec, rank)
                out.setdefault(rank, {})[key] = _on_device(one, device)
            reader.forget()
        return out
    finally:
        reader.close()
