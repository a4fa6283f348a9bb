"""Asynchronous saves: copy the boxes a rank writes now, write and commit in the background.

``save(state, path, groups, blocking=False)`` (or :func:`save_async`) returns as soon as
the calling rank's owned boxes are copied into CPU buffers (pinned ones, one
synchronization, for accelerator tensors): the training loop may then change its
tensors in place. A background thread writes the shard file and runs the usual commit
protocol (every rank's records gathered, the index replaced atomically by one rank), so
a crash at any point still leaves the previous checkpoint loadable.

The protocol's collectives never share a process group with the training loop: the
first asynchronous save over a mesh's ranks creates, on every rank at the same point of
the program, a gloo group of those ranks that only checkpoint threads use; later saves
over the same ranks (and timeout) reuse it, from any
:class:`~meshplan.runtime.ProcessGroups` object, so a loop that builds new ones does not
accumulate groups. At most one asynchronous save per checkpoint group runs at a time:
the next one first waits for the previous (and raises its error, if it failed and nobody
waited for it), so the checkpoint group's collectives never interleave.
"""

from __future__ import annotations

import atexit
import datetime
import gc
import os
import threading
import time
from collections.abc import Mapping
from typing import Any

import torch

from meshplan.errors import CheckpointError
from meshplan.placement import Sharded

from ._index import Metadata
from ._index_json import checkpoint_path
from ._plan import writes
from ._protocol import save_distributed, save_sole
from ._ranks import check_groups, check_whole_mesh

__all__ = ["SaveHandle", "save_async"]


class SaveHandle:
    """A save running in the background; :meth:`wait` returns its index or raises its error.

    ``staging_seconds`` is how long the caller was held (copying its boxes); the
    write and the commit overlap whatever the caller does next.
    """

    def __init__(self, path: str, staging_seconds: float) -> None:
        self.path = path
        self.staging_seconds = staging_seconds
        self.seconds: float | None = None  # staging + write + commit, once done
        self._thread: threading.Thread | None = None
        self._result: Metadata | None = None
        self._error: BaseException | None = None
        self._waited = False

    def _run(self, work: Any, started: float) -> None:
        try:
            self._result = work()
        except BaseException as e:  # handed to wait()
            self._error = e
        finally:
            self.seconds = time.perf_counter() - started

    def done(self) -> bool:
        """True once the save has committed or failed."""
        return self._thread is None or not self._thread.is_alive()

    def wait(self, timeout: float | None = None) -> Metadata | None:
        """Block until the save is over; its index (None on a rank outside the mesh).

        Raises the save's :class:`CheckpointError` (with ``committed`` when a peer was
        lost), or a :class:`CheckpointError` if ``timeout`` seconds pass first.
        """
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                raise CheckpointError(
                    f"the save to {self.path!r} is still running after {timeout} s; wait "
                    "longer (wait() without a timeout blocks until it is over)",
                    value=self.path,
                )
        self._waited = True
        if self._error is not None:
            raise self._error
        return self._result

    def __repr__(self) -> str:
        state = "running" if not self.done() else "failed" if self._error else "committed"
        return f"SaveHandle({self.path!r}, {state})"


class _SideGroup:
    """A gloo group over a mesh's ranks that only checkpoint threads use, and the save
    running on it (at most one at a time)."""

    def __init__(self, order: tuple[int, ...], rank: int, timeout: float, local: bool) -> None:
        import torch.distributed as dist

        from meshplan.runtime._groups import Group

        pg = dist.new_group(
            list(order),
            timeout=datetime.timedelta(seconds=timeout),
            backend="gloo",
            use_local_synchronization=local,
            sort_ranks=False,
            group_desc="meshplan:checkpoint",
        )
        self.group = Group("checkpoint", order, order, rank, pg, timeout) if rank in order else None
        self.pending: SaveHandle | None = None


class _CheckpointGroups:
    """What the commit protocol reads of a ProcessGroups, over its side group."""

    def __init__(self, groups: Any, side: _SideGroup) -> None:
        self.mesh = groups.mesh
        self.rank = groups.rank
        self.timeout = groups.timeout
        self.side = side

    def create(self, dims: Any = None) -> Any:
        return self.side.group


# The shell's checkpoint groups: one per (mesh ranks in order, timeout, local), shared by
# every ProcessGroups of the process (a new ProcessGroups per save reuses it), and dropped
# when torch.distributed is re-initialized. Every rank looks one up at the same point of
# the program (each save_async call), so every rank creates the same groups in one order.
_SIDES: dict[Any, Any] = {}


def _side_group(groups: Any) -> _SideGroup:
    import torch.distributed as dist

    world = dist.group.WORLD
    if _SIDES.get("world") is not world:
        _SIDES.clear()
        _SIDES["world"] = world
    (order,) = groups.mesh.groups(None)  # a whole mesh: checked by the caller
    key = (tuple(order), groups.timeout, groups.local)
    side = _SIDES.get(key)
    if side is None:
        side = _SIDES[key] = _SideGroup(tuple(order), groups.rank, groups.timeout, groups.local)
    return side


@atexit.register
def _release_at_exit() -> None:
    # like the runtime's groups: drop torch groups while Python still runs (gloo groups
    # alive at interpreter teardown can abort the process)
    _SIDES.clear()
    gc.collect()


def _host_copy(state: Mapping[str, Any], rank: int | None) -> dict[str, Any]:
    """``state`` with every value this process writes copied to a fresh contiguous CPU
    tensor (values it does not write, and malformed ones, are passed on as they are:
    the save reports those on every rank)."""
    out: dict[str, Any] = {}
    devices = set()
    for key, value in state.items():
        if not isinstance(value, Sharded) or not isinstance(value.local, torch.Tensor):
            out[key] = value
            continue
        local = value.local.detach()
        if local.is_meta or value.spec.is_partial:
            out[key] = value
            continue
        try:
            skip = rank is not None and not writes(value.spec, rank)
        except CheckpointError:  # not this rank's tensor: the save says so
            skip = True
        if skip:
            out[key] = value  # another rank writes every box of it: never read
            continue
        if local.device.type == "cpu":
            host = torch.empty(local.shape, dtype=local.dtype)
            host.copy_(local)
        else:
            host = torch.empty(local.shape, dtype=local.dtype, pin_memory=True)
            host.copy_(local, non_blocking=True)
            devices.add(local.device)
        out[key] = Sharded(host, value.spec, value.rank)
    for device in devices:  # the buffers are complete once the device is done
        getattr(torch, device.type).synchronize(device)
    return out


def save_async(
    state: Mapping[str, Sharded], path: str | os.PathLike[str], groups: Any = None
) -> SaveHandle:
    """Start saving ``state`` like :func:`~meshplan.checkpoint.save`; return once the
    boxes this rank writes are copied, with a :class:`SaveHandle` to wait on.

    Every rank of ``groups.mesh`` calls it at the same point of the program (the first
    call creates the checkpoint's own gloo group). The caller may change its tensors as
    soon as it returns; it calls ``handle.wait()`` before it exits (or before it reads
    the checkpoint).

    >>> import tempfile
    >>> from meshplan.layout import Mesh
    >>> from meshplan.placement import Replicate, Spec
    >>> spec = Spec(Mesh.create(1), (Replicate(),), (3,), "int64")
    >>> w = torch.arange(3)
    >>> handle = save_async({"w": Sharded(w, spec, 0)}, tempfile.mkdtemp())
    >>> _ = w.mul_(10)                   # the loop goes on; the save holds its own copy
    >>> handle.wait()["w"].spec == spec
    True
    """
    # resolved now: the caller may change directory while the save runs
    directory = os.path.abspath(checkpoint_path(path))
    side = None
    if groups is not None:
        check_groups(groups)
        check_whole_mesh(groups.mesh)
        shared = _side_group(groups)
        previous, shared.pending = shared.pending, None
        if previous is not None and not previous._waited:
            previous.wait()  # one save at a time on the checkpoint group; its error surfaces
        side = _CheckpointGroups(groups, shared)
    started = time.perf_counter()
    # a malformed state is passed on as it is: the save reports it (on every rank)
    staged = _host_copy(state, side and side.rank) if isinstance(state, Mapping) else state
    handle = SaveHandle(directory, time.perf_counter() - started)
    if side is None:
        work = lambda: save_sole(staged, directory)  # noqa: E731
    else:
        work = lambda: save_distributed(staged, directory, side)  # noqa: E731
        side.side.pending = handle
    thread = threading.Thread(
        target=handle._run, args=(work, started), name=f"meshplan-save {directory}"
    )
    handle._thread = thread
    thread.start()
    return handle
