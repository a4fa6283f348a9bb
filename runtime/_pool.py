"""A long-lived pool of worker processes that share one ``torch.distributed`` world.

Starting a process that imports torch costs seconds; a test suite (or an example, or a
notebook) that runs many small multi-process checks starts one :class:`WorkerPool` and
sends it tasks. Every task runs on every rank at once, and ``run`` returns one result per
rank, ordered by rank.

Workers are forked from a ``forkserver`` that has imported torch once (``spawn`` works
too, slower), join a world through a ``TCPStore`` served by the parent on 127.0.0.1 (the
port is chosen by the OS, so there is no port race) and call
``torch.distributed.init_process_group``. A task is a picklable callable (a module-level
function: of an installed module, of the main script, or of a test module, because the
parent's ``sys.path`` travels with every task) plus picklable arguments.

Failures are bounded and loud: a task that raises on some rank, a worker that dies, or a
task that outlives its timeout ends ``run`` with a :class:`WorkerError` naming each rank's
fate (the remote traceback included). Such a failure leaves the distributed state of the
survivors unknown (a rank that skipped a collective desynchronizes every later one), so
the pool is marked broken and restarts on the next ``run``. A task that raises is
published to its peers first (:mod:`._failstop`): those waiting for it in a meshplan
collective stop within seconds instead of at the groups' timeout. A world that failed
so is never reused, even when every task caught its error and returned: ``alive``
turns False and the next ``run`` starts a fresh one.

Tasks run one at a time: ``run`` called from several threads serves the callers one after
another, and each gets its own task's replies.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import multiprocessing
import multiprocessing.connection
import pickle
import sys
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from meshplan.errors import RemoteError, RuntimeShellError, TaskTimeout, WorkerDied, WorkerError

from ._failstop import Failure
from ._worker import worker_main

__all__ = ["WorkerPool", "RemoteError"]

_HOST = "127.0.0.1"
_PRELOAD = (
    "__main__",
    "torch",
    "torch.distributed",
    "meshplan.layout",
    "meshplan.runtime._pool",
    "meshplan.runtime._groups",
    "meshplan.runtime._collectives",
    "meshplan.runtime._failstop",
    "meshplan.runtime._p2p",
)


class _RemoteTraceback(Exception):
    def __init__(self, rank: int, text: str) -> None:
        super().__init__(text)
        self.rank, self.text = rank, text

    def __str__(self) -> str:
        return f"\n--- traceback on rank {self.rank} ---\n{self.text}"


class WorkerPool:
    """``world_size`` worker processes in one ``torch.distributed`` world, started lazily.

    ``run(fn, *args, **kwargs)`` calls ``fn(*args, **kwargs)`` on every rank and returns
    the results in rank order. Nothing starts before the first ``run`` (or ``start``);
    ``shutdown`` (or leaving a ``with`` block) stops the workers.

    ``timeout`` bounds each task (seconds), ``pg_timeout`` the world group's collectives,
    ``death_grace`` how long the survivors of a dead worker get to report. ``preload``
    names modules the fork server imports once (torch and meshplan's shell always), so
    that tasks importing them start instantly; ``env`` is set in every worker;
    ``threads`` is each worker's torch thread count. Tasks run one at a time: ``run``
    from several threads serves the callers one after another, each with its own
    task's replies (a task is every rank's collective work, so two cannot interleave).

    Workers are started with ``forkserver`` (or ``spawn``): they import the module that
    defines each task by name, so a script that makes a pool must keep its top-level
    code under ``if __name__ == "__main__":`` (otherwise every worker would run the
    script again) and define its tasks at module level. With ``backend="nccl"`` worker
    ``r`` takes GPU ``r % torch.cuda.device_count()`` as its current device.

    >>> pool = WorkerPool(4, timeout=30)    # nothing is spawned yet
    >>> pool.world_size, pool.alive, pool.starts
    (4, False, 0)
    >>> pool.shutdown()                     # a no-op on a pool that never started
    """

    def __init__(
        self,
        world_size: int,
        backend: str = "gloo",
        *,
        timeout: float = 120.0,
        start_timeout: float = 180.0,
        pg_timeout: float = 60.0,
        death_grace: float = 10.0,
        start_method: str = "forkserver",
        threads: int = 1,
        env: Mapping[str, str] | None = None,
        preload: Sequence[str] = (),
    ) -> None:
        if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
            raise RuntimeShellError(
                f"a worker pool needs world_size >= 1, got {world_size!r}", value=world_size
            )
        if start_method not in multiprocessing.get_all_start_methods():
            raise RuntimeShellError(
                f"start method {start_method!r} is not available here; use one of "
                f"{multiprocessing.get_all_start_methods()!r}",
                value=start_method,
            )
        if start_method == "fork":
            raise RuntimeShellError(
                "start method 'fork' would copy the parent's torch.distributed state into "
                "the workers; use 'forkserver' or 'spawn'",
                value=start_method,
            )
        self.world_size = world_size
        self.backend = backend
        self.timeout = _seconds("timeout", timeout)
        self.start_timeout = _seconds("start_timeout", start_timeout)
        self.pg_timeout = _seconds("pg_timeout", pg_timeout)
        self.death_grace = _seconds("death_grace", death_grace)
        self.start_method = start_method
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise RuntimeShellError(
                f"threads={threads!r:.80} must be an int >= 1 (torch threads per worker)",
                value=threads,
            )
        self.threads = threads
        if not isinstance(backend, str) or not backend:
            raise RuntimeShellError(
                f"backend={backend!r:.80} must name a torch.distributed backend ('gloo', 'nccl')",
                value=backend,
            )
        env = {} if env is None else env
        if not isinstance(env, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in env.items()
        ):
            raise RuntimeShellError(
                f"env={env!r:.80} must map environment variable names to string values",
                value=env,
            )
        self.env = dict(env)
        preload = () if preload is None else preload
        if isinstance(preload, str) or not isinstance(preload, Sequence | frozenset | set):
            raise RuntimeShellError(
                f"preload={preload!r:.80} must be a sequence of module names", value=preload
            )
        if not all(isinstance(m, str) for m in preload):
            raise RuntimeShellError(
                f"preload={preload!r:.80} must hold module names (strings)", value=preload
            )
        self.preload = tuple(preload)
        self.starts = 0
        self._procs: list[Any] = []
        self._conns: list[multiprocessing.connection.Connection] = []
        self._store: Any = None
        self._broken = False
        self._failure: Failure | None = None  # the world's, reported by a worker
        self._tasks = 0
        # one caller at a time drives the pipes (start, run, shutdown); reentrant since
        # run starts the pool
        self._lock = threading.RLock()
        atexit.register(_shutdown_ref, weakref.ref(self))

    # -- lifecycle --------------------------------------------------------------------

    @property
    def alive(self) -> bool:
        """True when the workers are up and ready for a task (every worker process is
        running: one that died between tasks makes this False until the next start)."""
        return bool(self._procs) and not self._broken and all(p.is_alive() for p in self._procs)

    def _check_workers(self) -> None:
        """Restart the pool when a worker died between tasks (no task was running, so
        nothing is lost; the survivors' world lacks a member and cannot be reused)."""
        if self._procs and not self._broken and not all(p.is_alive() for p in self._procs):
            self._broken = True

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def __repr__(self) -> str:
        state = "alive" if self.alive else ("broken" if self._procs else "stopped")
        return f"WorkerPool(world_size={self.world_size}, backend={self.backend!r}, {state})"

    def start(self) -> None:
        """Spawn the workers and wait until every rank has joined the world."""
        with self._lock:
            self._start()

    def _start(self) -> None:
        if self.alive:
            return
        if self._procs:
            self._kill()
        from torch.distributed import TCPStore

        ctx = multiprocessing.get_context(self.start_method)
        if self.start_method == "forkserver":
            ctx.set_forkserver_preload([*_PRELOAD, *self.preload])
        store = TCPStore(
            _HOST,
            0,
            self.world_size,
            is_master=True,
            wait_for_workers=False,
            timeout=datetime.timedelta(seconds=self.start_timeout),
        )
        config = {
            "world_size": self.world_size,
            "backend": self.backend,
            "host": _HOST,
            "port": store.port,
            "pg_timeout": self.pg_timeout,
            "start_timeout": self.start_timeout,
            "threads": self.threads,
            "env": self.env,
        }
        procs, conns = [], []
        for rank in range(self.world_size):
            parent_end, child_end = ctx.Pipe(duplex=True)
            proc = ctx.Process(
                target=worker_main,
                args=(rank, config, child_end),
                name=f"meshplan-worker-{rank}",
                daemon=True,
            )
            proc.start()
            child_end.close()
            procs.append(proc)
            conns.append(parent_end)
        self._procs, self._conns, self._store = procs, conns, store
        self._broken = False
        self._failure = None
        self.starts += 1
        outcomes = self._collect(time.monotonic() + self.start_timeout, "start")
        failed = {r: o for r, o in outcomes.items() if isinstance(o, BaseException)}
        if failed:
            self._kill()
            raise _error(f"starting a {self.world_size}-rank {self.backend} pool", failed, {})

    def restart(self) -> None:
        """Stop the workers (forcibly) and start fresh ones."""
        with self._lock:
            self._kill()
            self._start()

    def shutdown(self, timeout: float = 10.0) -> None:
        """Ask the workers to leave the world and exit; kill any that do not (after the
        task that is running, if any)."""
        with self._lock:
            self._shutdown(timeout)

    def _shutdown(self, timeout: float) -> None:
        if not self._procs:
            return
        if not self._broken:
            for conn in self._conns:
                with contextlib.suppress(OSError, ValueError):
                    conn.send_bytes(pickle.dumps(("stop", None)))
            deadline = time.monotonic() + timeout
            for proc in self._procs:
                proc.join(max(0.0, deadline - time.monotonic()))
        self._kill()

    def _kill(self) -> None:
        for proc in self._procs:
            if proc.is_alive():
                proc.terminate()
        for proc in self._procs:
            proc.join(5.0)
            if proc.is_alive():
                proc.kill()
                proc.join(5.0)
        for conn in self._conns:
            conn.close()
        self._procs, self._conns, self._store = [], [], None
        self._broken = False

    # -- tasks ------------------------------------------------------------------------

    def run(
        self,
        fn: Callable[..., Any],
        *args: Any,
        timeout: float | None = None,
        return_exceptions: bool = False,
        **kwargs: Any,
    ) -> list[Any]:
        """Call ``fn(*args, **kwargs)`` on every rank; return the results in rank order.

        Raises :class:`WorkerError` when a rank raises, dies or exceeds ``timeout``
        (default: the pool's); with ``return_exceptions=True`` the failed ranks' entries
        hold their exceptions instead. Either way a failed task makes the pool restart
        before the next one.
        """
        try:
            payload = pickle.dumps((fn, args, kwargs))
        except Exception as exc:  # any pickling failure
            raise RuntimeShellError(
                f"cannot send task {fn!r} to the workers: {exc}; pass a module-level "
                "function and picklable arguments",
                value=fn,
            ) from exc
        limit = self.timeout if timeout is None else _seconds("timeout", timeout)
        with self._lock:
            return self._run(fn, payload, limit, return_exceptions)

    def _run(self, fn: Any, payload: bytes, limit: float, return_exceptions: bool) -> list[Any]:
        self._check_workers()
        if not self.alive:
            self._start()
        self._tasks += 1
        task = ("task", (self._tasks, list(sys.path), payload))
        message = pickle.dumps(task)
        dead: dict[int, BaseException] = {}
        for rank, conn in enumerate(self._conns):
            try:
                conn.send_bytes(message)
            except (OSError, ValueError):  # BrokenPipeError: the worker is gone
                proc = self._procs[rank]
                proc.join(1.0)
                dead[rank] = WorkerDied(
                    f"worker of rank {rank} (pid {proc.pid}) died before task {_name(fn)} "
                    f"reached it (exit code {proc.exitcode})",
                    value=proc.exitcode,
                )
        if dead:
            self._kill()
            self._broken = True
            raise _error(f"task {_name(fn)}", dead, {})
        outcomes = self._collect(time.monotonic() + limit, "task", self._tasks)
        if self._failure is not None:  # even if every rank's task returned
            self._broken = True
        failed = {r: o for r, o in outcomes.items() if isinstance(o, BaseException)}
        if failed:
            self._broken = True
            self._kill_if_stuck(outcomes)
            if return_exceptions:
                return [outcomes[r] for r in range(self.world_size)]
            results = {r: o for r, o in outcomes.items() if r not in failed}
            raise _error(f"task {_name(fn)}", failed, results)
        return [outcomes[r] for r in range(self.world_size)]

    def _kill_if_stuck(self, outcomes: Mapping[int, Any]) -> None:
        if any(isinstance(o, TaskTimeout | WorkerDied) for o in outcomes.values()):
            self._kill()
            self._broken = True

    def _collect(self, deadline: float, kind: str, task_id: int | None = None) -> dict[int, Any]:
        """Wait for one reply per rank until ``deadline``; deaths and silence become errors."""
        outcomes: dict[int, Any] = {}
        by_conn = {conn: r for r, conn in enumerate(self._conns)}
        by_sentinel = {p.sentinel: r for r, p in enumerate(self._procs)}
        first_death: float | None = None
        while len(outcomes) < self.world_size:
            now = time.monotonic()
            limit = (
                deadline if first_death is None else min(deadline, first_death + self.death_grace)
            )
            if now >= limit:
                break
            waiting = [c for c, r in by_conn.items() if r not in outcomes]
            waiting += [s for s, r in by_sentinel.items() if r not in outcomes]
            for ready in multiprocessing.connection.wait(waiting, timeout=limit - now):
                rank = by_conn[ready] if ready in by_conn else by_sentinel[ready]
                if rank in outcomes:
                    continue
                conn = self._conns[rank]
                try:
                    # a dead worker's pipe reads as EOF; a live one's holds a reply
                    data = conn.recv_bytes() if conn.poll(0) else None
                except (EOFError, OSError):
                    data = None
                if data is not None:
                    try:
                        reply = pickle.loads(data)
                        if reply[3] is not None:  # the world failed: its groups are unusable
                            self._failure = Failure(*reply[3])
                        outcomes[rank] = _unpack_reply(rank, reply[:3], task_id)
                    except Exception as exc:  # an unpicklable reply
                        outcomes[rank] = RemoteError(
                            f"rank {rank}'s reply could not be unpickled: {exc!r}"
                        )
                    continue
                proc = self._procs[rank]
                proc.join(1.0)
                if proc.is_alive():
                    continue  # a spurious wake-up; keep waiting
                outcomes[rank] = WorkerDied(
                    f"worker of rank {rank} died during {kind} (exit code {proc.exitcode})",
                    value=proc.exitcode,
                )
                first_death = first_death or time.monotonic()
        for rank in range(self.world_size):
            if rank not in outcomes:
                waited = "the grace period after a death" if first_death else "the timeout"
                outcomes[rank] = TaskTimeout(
                    f"rank {rank} did not finish {kind} within {waited}", value=rank
                )
        return outcomes


def _seconds(name: str, value: Any) -> float:
    """``value`` as a positive, finite number of seconds, or a RuntimeShellError."""
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if not ok or not 0 < value < float("inf"):
        raise RuntimeShellError(
            f"{name}={value!r} must be a positive, finite number of seconds (e.g. {name}=60.0)",
            value=value,
        )
    return float(value)


def _unpack_reply(rank: int, reply: tuple[Any, ...], task_id: int | None) -> Any:
    status, reply_id, body = reply
    if task_id is not None and reply_id != task_id:
        return RemoteError(f"rank {rank} answered task {reply_id}, expected task {task_id}")
    if status == "ok":
        return body
    exc_bytes, text = body
    try:
        exc = pickle.loads(exc_bytes) if exc_bytes is not None else None
    except Exception:  # an exception class the parent cannot rebuild
        exc = None
    if not isinstance(exc, BaseException):
        first = text.strip().splitlines()[-1] if text.strip() else "unknown error"
        exc = RemoteError(f"rank {rank} raised {first}")
    exc.__cause__ = _RemoteTraceback(rank, text)
    return exc


def _error(
    what: str, failed: Mapping[int, BaseException], results: Mapping[int, Any]
) -> WorkerError:
    lines = [f"{what} failed on {len(failed)} rank(s):"]
    for rank in sorted(failed):
        exc = failed[rank]
        lines.append(f"  rank {rank}: {type(exc).__name__}: {exc}")
    first = min(failed, key=lambda r: (_echo(failed[r]), r))
    cause = failed[first].__cause__
    if isinstance(cause, _RemoteTraceback):
        lines.append(str(cause))
    lines.append("the pool restarts before its next task")
    return WorkerError("\n".join(lines), errors=failed, results=results)


def _echo(exc: BaseException) -> int:
    """How far ``exc`` is from a task's own failure: 0 for an error a task raised, 1 for a
    rank stopping because a peer failed (:mod:`._failstop`), 2 for a death or a timeout."""
    if isinstance(exc, TaskTimeout | WorkerDied):
        return 2
    return 1 if isinstance(getattr(exc, "value", None), Failure) else 0


def _name(fn: Any) -> str:
    module = getattr(fn, "__module__", None)
    qualname = getattr(fn, "__qualname__", None)
    return f"{module}.{qualname}" if module and qualname else repr(fn)


def _shutdown_ref(ref: weakref.ref[WorkerPool]) -> None:
    pool = ref()
    if pool is not None:
        pool._kill()
