"""Regressions: a worker that dies between tasks is detected (``alive`` says so) and the pool
recovers; bad timeouts are refused with a typed error."""

import os
import signal
import time

import pytest

from meshplan.errors import RuntimeShellError, WorkerError
from meshplan.runtime._pool import WorkerPool


def _pid():
    return os.getpid()


@pytest.fixture(scope="module")
def pool2():
    pool = WorkerPool(2, timeout=60.0, pg_timeout=30.0, preload=("pytest",))
    yield pool
    pool.shutdown()


def _kill_worker(pool, rank):
    pid = pool.run(_pid)[rank]
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while pool._procs[rank].is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    return pid


@pytest.mark.parametrize("trial", range(3))
def test_a_worker_dead_between_tasks_is_seen_and_the_pool_recovers(pool2, trial):
    old = _kill_worker(pool2, trial % 2)
    assert pool2.alive is False  # it no longer claims a world it cannot run
    assert "broken" in repr(pool2) or "stopped" in repr(pool2)
    starts = pool2.starts
    pids = pool2.run(_pid)  # restarts first: the dead worker ran no task, nothing is lost
    assert old not in pids and pool2.starts == starts + 1 and pool2.alive


def test_a_worker_dying_as_a_task_is_sent_raises_a_worker_error_naming_it(pool2, monkeypatch):
    _kill_worker(pool2, 1)
    # the death is not yet seen when the task goes out (it happens right after the check)
    monkeypatch.setattr(pool2._procs[1], "is_alive", lambda: True)
    with pytest.raises(WorkerError, match="rank 1") as info:
        pool2.run(_pid)
    monkeypatch.undo()
    assert list(info.value.errors) == [1]
    assert pool2.alive is False
    assert len(pool2.run(_pid)) == 2  # and the pool recovers


@pytest.mark.parametrize("field", ["timeout", "start_timeout", "pg_timeout", "death_grace"])
@pytest.mark.parametrize("bad", ["x", -5, 0, float("nan"), float("inf"), True, None])
def test_bad_timeouts_are_refused_with_a_typed_error(field, bad):
    with pytest.raises(RuntimeShellError, match=field):
        WorkerPool(2, **{field: bad})


def test_a_bad_task_timeout_is_refused_before_anything_runs():
    pool = WorkerPool(2)
    with pytest.raises(RuntimeShellError, match="timeout"):
        pool.run(_pid, timeout=-1)
    assert pool.starts == 0


def _tagged(tag):
    import torch.distributed as dist

    return (tag, dist.get_rank())


def test_run_from_two_threads_gives_each_caller_its_own_replies(pool2):
    import threading

    pool2.run(_pid)  # started before the threads race
    starts = pool2.starts
    got: dict[int, list] = {0: [], 1: []}
    errors: list[BaseException] = []

    def caller(tag):
        try:
            for i in range(40):
                got[tag].append(pool2.run(_tagged, (tag, i), timeout=30))
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=caller, args=(t,)) for t in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    for tag in (0, 1):
        assert got[tag] == [[((tag, i), 0), ((tag, i), 1)] for i in range(40)]
    assert pool2.starts == starts  # no failure, so no restart
