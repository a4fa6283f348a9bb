"""Fail-stop for a ``torch.distributed`` world: the first rank that fails tells the others.

A rank that raises in the middle of a program (a ``MemoryError`` in a local op, a bug, a
collective that failed under it) leaves its peers waiting for it in their next
collective; gloo cannot interrupt a collective from Python (``ProcessGroup.abort`` does
not wake a blocked gloo op, torch 2.13), so without help they would wait until the
groups' timeout (600 s by default). The shell therefore keeps one record per world in
the world's default store (the c10d store every rank of the world shares, under
:data:`FAILURE_KEY`):

* :func:`publish` -- a rank that fails in a block of collectives (:class:`fail_stop`
  around ``run`` and ``run_program``, a pool worker's task) writes ``rank`` and its
  error there; the first writer wins (``compare_set``), and the rank remembers it.
* :func:`wait` -- every meshplan collective on CPU tensors is issued asynchronously and
  waited for in slices of :data:`POLL_SECONDS`; while it waits longer than a slice the
  rank looks for the record (one store lookup per slice, none for a collective that
  finishes within one), and when it is there raises :class:`RuntimeShellError` naming
  the failed rank and its error. So every rank stops within about a slice of the
  failure. A collective that fails by itself (a dead peer, the groups' own timeout) is
  published in turn, so that ranks waiting elsewhere stop too.
* :func:`check` -- afterwards the world's groups are unusable (a collective left
  pending on some rank would pair with the next one issued: wrong data): every
  meshplan collective, and creating a group, refuses at once on a rank that knows of
  the failure. Start a new world (a :class:`~meshplan.runtime.WorkerPool` restarts its
  workers before its next task; under ``torchrun``, restart the job).

The record lives as long as the store: a world re-initialized on the same store (same
prefix) inherits it. CUDA tensors (NCCL) are waited for as torch does (NCCL's own
watchdog bounds them), and so are point-to-point exchanges (gloo fails a send or receive
whose wait times out, so they cannot be waited for in slices): a rank blocked in one
stops at the groups' timeout, or when the failed rank's process exits. Nothing is published while ``torch.compile`` traces, nor on a
world whose store cannot hold the record (the in-process ``fake`` backend).
"""

from __future__ import annotations

import datetime
import functools
import json
import time
from typing import Any

import attrs

from meshplan.errors import RuntimeShellError

__all__ = [
    "FAILURE_KEY",
    "POLL_SECONDS",
    "Failure",
    "check",
    "fail_stop",
    "fails_world",
    "failure",
    "publish",
    "wait",
]

FAILURE_KEY = "meshplan/failure"
"""The default-store key of a world's first failure (JSON: rank and error)."""

POLL_SECONDS = 0.5
"""How long a collective waits before each look at the store for a peer's failure."""

_TEXT = 600  # characters of an error kept in the record


@attrs.frozen
class Failure:
    """A world's first failure: the rank that failed and its error (``Type: message``).

    >>> str(Failure(2, "MemoryError: out of memory"))
    'rank 2 failed (MemoryError: out of memory)'
    """

    rank: int
    error: str

    def __str__(self) -> str:
        return f"rank {self.rank} failed ({self.error})"


# The shell's record of its world's failure: (the world's default group, Failure or None);
# forgotten when torch.distributed is initialized anew.
_KNOWN: list[Any] = [None, None]


def _world() -> Any:
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        return None
    return dist.group.WORLD


def _known(world: Any) -> Failure | None:
    return _KNOWN[1] if _KNOWN[0] is world else None


def _remember(world: Any, found: Failure) -> Failure:
    if _KNOWN[0] is not world or _KNOWN[1] is None:
        _KNOWN[0], _KNOWN[1] = world, found
    return _KNOWN[1]


def _store() -> Any:
    import torch.distributed as dist

    return dist.distributed_c10d._get_default_store()


def _describe(exc: BaseException) -> str:
    text = str(exc).strip()
    first = text.splitlines()[0] if text else ""
    out = f"{type(exc).__name__}: {first}" if first else type(exc).__name__
    return out[:_TEXT]


def publish(exc: BaseException) -> Failure | None:
    """Record ``exc`` as this rank's failure for every rank of the world, unless a failure
    is recorded already; return the world's first failure (None: no world, a world of
    one rank, or a store that cannot hold it)."""
    import torch.distributed as dist

    world = _world()
    if world is None or dist.get_world_size() < 2:
        return None
    found = _known(world)
    if found is not None:
        return found
    if isinstance(getattr(exc, "value", None), Failure):  # a peer's failure, seen here
        return _remember(world, exc.value)
    mine = json.dumps({"rank": dist.get_rank(), "error": _describe(exc)})
    try:
        first = _store().compare_set(FAILURE_KEY, "", mine)
    except Exception:  # a store without compare_set (fake) or gone: nothing to tell
        return None
    return _remember(world, _decode(first))


def failure(*, ask_store: bool = True) -> Failure | None:
    """The world's recorded failure: this rank's record, else (``ask_store``) the store's."""
    world = _world()
    if world is None:
        return None
    found = _known(world)
    if found is not None or not ask_store:
        return found
    try:
        store = _store()
        if not store.check([FAILURE_KEY]):
            return None
        return _remember(world, _decode(store.get(FAILURE_KEY)))
    except Exception:  # a store that cannot say: nothing is known
        return None


def _decode(raw: bytes) -> Failure:
    try:
        data = json.loads(raw)
        return Failure(int(data["rank"]), str(data["error"]))
    except Exception:  # a record not written by publish
        return Failure(-1, repr(raw[:_TEXT]))


def check(what: str, group: Any) -> None:
    """Raise at once when this rank knows its world failed (its groups are unusable)."""
    if _KNOWN[1] is None:
        return
    found = _known(_world())
    if found is not None:
        raise _stopped(what, group, found, "refused")


def _stopped(what: str, group: Any, found: Failure, verb: str) -> RuntimeShellError:
    where = f" on group {group.name!r} (ranks {group.ranks!r})" if group is not None else ""
    me = f" on rank {group.rank}" if group is not None else ""
    return RuntimeShellError(
        f"{what}{where} {verb}{me}: {found} while the world ran collectives, so every "
        "rank stops. The world's process groups are unusable now; start a new world "
        "(a WorkerPool restarts its workers before its next task; under torchrun, "
        "restart the job)",
        value=found,
    )


def wait(work: Any, group: Any, what: str, *, cuda: bool = False) -> None:
    """Wait for ``work`` (an async collective on ``group``), looking for a peer's failure
    every :data:`POLL_SECONDS`; raise :class:`RuntimeShellError` when one is recorded,
    when the collective fails, or when it outlives the group's timeout."""
    if work is None:
        return
    if cuda:  # NCCL: wait() orders the stream; its watchdog bounds the collective
        try:
            work.wait()
        except RuntimeError as exc:
            raise _failed(what, group, exc) from exc
        return
    piece = datetime.timedelta(seconds=POLL_SECONDS)
    deadline = time.monotonic() + group.timeout + 2 * POLL_SECONDS
    while True:
        try:
            work.wait(piece)
            return
        except RuntimeError as exc:
            if work.is_completed():  # the collective itself failed
                raise _failed(what, group, exc) from exc
            found = failure()
            if found is not None:
                raise _stopped(what, group, found, "failed") from None
            if time.monotonic() > deadline:
                raise _failed(what, group, exc) from exc


def _failed(what: str, group: Any, exc: BaseException) -> RuntimeShellError:
    from ._collectives import _shell_error

    err = _shell_error(what, group, exc)
    publish(err)
    return err


class fail_stop:  # noqa: N801 -- used as a block, like ``guard``
    """Publish any exception that leaves the block (see :func:`publish`): the block runs
    collectives, so the other ranks may be waiting for this one. A plain class, cheap
    to enter; nothing happens while ``torch.compile`` traces.

    >>> with fail_stop():   # no world: nothing to tell
    ...     pass
    """

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind, exc, tb) -> bool:
        if exc is not None:
            import torch

            if not torch.compiler.is_compiling():
                publish(exc)
        return False


def fails_world(fn: Any) -> Any:
    """``fn`` run in a :class:`fail_stop` block (for the bodies of autograd functions that
    run collectives: a backward runs where the caller cannot wrap it)."""

    @functools.wraps(fn)
    def in_fail_stop(*args: Any, **kwargs: Any) -> Any:
        with fail_stop():
            return fn(*args, **kwargs)

    return in_fail_stop
