"""The worker side of a :class:`~meshplan.runtime.WorkerPool`: join the world, run tasks.

:func:`worker_main` is each worker process's body. It joins the pool's
``torch.distributed`` world through the parent's ``TCPStore``, reports ``("ok", 0,
rank, None)`` (or the failure), then serves the parent's messages on its pipe until told to
stop or the parent goes away:

* ``("task", (task_id, sys_path, payload))``: adopt the parent's ``sys.path``, unpickle
  ``(fn, args, kwargs)`` from ``payload``, call it and reply ``("ok", task_id,
  result, failure)``, or ``("err", task_id, (pickled exception or None, traceback
  text), failure)``. A task that raises is published to the other ranks first (see
  :mod:`._failstop`: they may be waiting for this rank in a collective), and
  ``failure`` is the world's recorded failure as ``(rank, error)``, or None: a world
  whose groups are unusable, even if every task returned;
* ``("stop", None)``: leave the world and exit.

An exception whose attributes cannot be pickled travels with those attributes as their
repr, and one that cannot travel at all as its traceback text only.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import pickle
import sys
import traceback
from typing import Any

from meshplan.errors import RuntimeShellError

from ._failstop import failure, publish

__all__ = ["bind_device", "worker_main"]


def worker_main(rank: int, config: dict[str, Any], conn: Any) -> None:
    """Join the world, then run tasks until told to stop (or the parent goes away)."""
    os.environ.update(config["env"])
    try:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(config["threads"])
        device_id = bind_device(config["backend"], rank)
        store = dist.TCPStore(
            config["host"],
            config["port"],
            config["world_size"],
            is_master=False,
            timeout=datetime.timedelta(seconds=config["start_timeout"]),
        )
        dist.init_process_group(
            config["backend"],
            store=store,
            rank=rank,
            world_size=config["world_size"],
            timeout=datetime.timedelta(seconds=config["pg_timeout"]),
            device_id=device_id,
        )
    except BaseException as exc:  # reported to the parent
        _reply(conn, "err", 0, _pack_exception(exc))
        return
    _reply(conn, "ok", 0, rank)
    while True:
        try:
            kind, body = pickle.loads(conn.recv_bytes())
        except (EOFError, OSError):
            break  # the parent is gone
        if kind == "stop":
            break
        task_id, parent_path, payload = body
        _adopt_sys_path(parent_path)
        try:
            fn, args, kwargs = pickle.loads(payload)
            reply: tuple[Any, ...] = ("ok", task_id, fn(*args, **kwargs))
        except BaseException as exc:  # reported to the parent, and to the peers
            publish(exc)  # they may be waiting for this rank in a collective
            reply = ("err", task_id, _pack_exception(exc))
        try:
            out = pickle.dumps((*reply, _world_failure()))
        except Exception as exc:  # a result that cannot travel
            out = pickle.dumps(("err", task_id, _pack_exception(exc), _world_failure()))
        try:
            conn.send_bytes(out)
        except (OSError, ValueError):
            break
    with contextlib.suppress(Exception):  # exiting anyway
        dist.destroy_process_group()


def _world_failure() -> tuple[int, str] | None:
    """The world's recorded failure, if any (see :mod:`._failstop`): the parent restarts a
    world whose groups are unusable even when every rank's task returned."""
    found = failure()
    return None if found is None else (found.rank, found.error)


def bind_device(backend: str, rank: int) -> Any:
    """For an NCCL world, give worker ``rank`` a GPU of its own (``rank % device_count``) and
    make it current: NCCL runs on the current device, so without this every worker would
    share GPU 0 (collectives then hang or fail). None for other backends."""
    if "nccl" not in str(backend).lower():
        return None
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count == 0:
        raise RuntimeShellError(
            f"backend {backend!r} needs CUDA GPUs, but this machine has none; use "
            "WorkerPool(n, 'gloo') on CPUs",
            value=backend,
        )
    device = torch.device("cuda", rank % count)
    torch.cuda.set_device(device)
    return device


def _adopt_sys_path(parent_path: list[str]) -> None:
    known = set(parent_path)
    sys.path[:] = list(parent_path) + [p for p in sys.path if p not in known]


def _pack_exception(exc: BaseException) -> tuple[bytes | None, str]:
    """The exception pickled (attributes that cannot travel become their repr), and its text."""
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    for candidate in (exc, _travel_copy(exc)):
        try:
            data = pickle.dumps(candidate)
            pickle.loads(data)
            return data, text
        except Exception:  # sent as text only
            continue
    return None, text


def _travel_copy(exc: BaseException) -> BaseException:
    clone = type(exc).__new__(type(exc))
    clone.args = exc.args
    for key, value in vars(exc).items():
        try:
            pickle.dumps(value)
        except Exception:  # keep what can be shown
            value = repr(value)
        setattr(clone, key, value)
    return clone


def _reply(conn: Any, status: str, task_id: int, body: Any) -> None:
    with contextlib.suppress(OSError, ValueError):
        conn.send_bytes(pickle.dumps((status, task_id, body, None)))
