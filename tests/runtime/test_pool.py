"""The worker pool: one world per pool, reused across tasks, loud and bounded failures."""

import os
import time

import pytest
import torch
import torch.distributed as dist

from meshplan.errors import RuntimeShellError, TaskTimeout, WorkerDied, WorkerError
from meshplan.runtime._pool import WorkerPool

# -- tasks (run on every rank) ------------------------------------------------------------


def _whoami(tag):
    return dist.get_rank(), dist.get_world_size(), dist.get_backend(), os.getpid(), tag


def _sum_of_ranks():
    t = torch.tensor([dist.get_rank()], dtype=torch.int64)
    dist.all_reduce(t)
    return int(t.item())


def _raise_on(rank):
    if dist.get_rank() == rank:
        raise ValueError(f"planned failure on rank {rank}")
    return dist.get_rank()


def _exit_on(rank):
    if dist.get_rank() == rank:
        os._exit(7)
    return dist.get_rank()


def _sleep(seconds):
    time.sleep(seconds)


class _Unpicklable(Exception):
    def __init__(self, a, b):
        super().__init__(a)
        self.lock = __import__("threading").Lock()


def _raise_unpicklable():
    raise _Unpicklable("cannot travel", 2)


# -- tests --------------------------------------------------------------------------------


def test_run_returns_one_result_per_rank_in_rank_order(pool):
    results = pool.run(_whoami, "x")
    n = pool.world_size
    assert [r[0] for r in results] == list(range(n))
    assert {r[1] for r in results} == {n}
    assert {r[2] for r in results} == {"gloo"}
    assert len({r[3] for r in results}) == n  # one process per rank
    assert {r[4] for r in results} == {"x"}


def test_workers_share_one_world(pool):
    n = pool.world_size
    assert pool.run(_sum_of_ranks) == [n * (n - 1) // 2] * n


def test_pool_is_reused_across_tasks(pool8):
    pids = [r[3] for r in pool8.run(_whoami, 1)]
    starts = pool8.starts
    for _ in range(5):
        assert [r[3] for r in pool8.run(_whoami, 2)] == pids
    assert pool8.starts == starts


def test_a_raising_rank_reports_its_exception_and_traceback_then_the_pool_restarts(pool4):
    pool4.run(_whoami, 0)
    starts = pool4.starts
    with pytest.raises(WorkerError) as info:
        pool4.run(_raise_on, 2)
    err = info.value
    assert isinstance(err, RuntimeShellError)
    assert set(err.errors) == {2}
    assert isinstance(err.errors[2], ValueError)
    assert "planned failure on rank 2" in str(err)
    assert "_raise_on" in str(err.errors[2].__cause__)  # the remote traceback
    assert err.results == {0: 0, 1: 1, 3: 3}
    assert pool4.run(_sum_of_ranks) == [6] * 4
    assert pool4.starts == starts + 1


def test_an_exception_that_cannot_be_pickled_still_arrives_as_text(pool4):
    with pytest.raises(WorkerError) as info:
        pool4.run(_raise_unpicklable)
    assert all("_Unpicklable" in str(e) for e in info.value.errors.values())
    assert pool4.run(_sum_of_ranks) == [6] * 4


def test_a_dead_worker_fails_the_task_clearly_and_the_pool_recovers(pool4):
    pool4.run(_whoami, 0)
    with pytest.raises(WorkerError) as info:
        pool4.run(_exit_on, 1)
    err = info.value
    assert isinstance(err.errors[1], WorkerDied)
    assert "exit code 7" in str(err)
    assert pool4.run(_sum_of_ranks) == [6] * 4


def test_a_hanging_task_is_bounded_by_the_timeout(pool4):
    pool4.run(_whoami, 0)
    start = time.monotonic()
    with pytest.raises(WorkerError) as info:
        pool4.run(_sleep, 60, timeout=1.0)
    assert time.monotonic() - start < 10
    assert all(isinstance(e, TaskTimeout) for e in info.value.errors.values())
    assert pool4.run(_sum_of_ranks) == [6] * 4


def test_return_exceptions_puts_each_ranks_exception_in_its_slot(pool4):
    results = pool4.run(_raise_on, 3, return_exceptions=True)
    assert results[:3] == [0, 1, 2]
    assert isinstance(results[3], ValueError)
    assert pool4.run(_sum_of_ranks) == [6] * 4


def test_an_unpicklable_task_is_refused_before_anything_runs(pool4):
    pool4.run(_whoami, 0)
    starts = pool4.starts
    with pytest.raises(RuntimeShellError, match="module-level function"):
        pool4.run(lambda: 1)
    assert pool4.run(_sum_of_ranks) == [6] * 4
    assert pool4.starts == starts


def test_a_pool_starts_lazily_and_stops_on_exit():
    with WorkerPool(2, timeout=30) as pool:
        assert not pool.alive and pool.starts == 0
        assert pool.run(_sum_of_ranks) == [1, 1]
        assert pool.alive and pool.starts == 1
        procs = list(pool._procs)
    assert not pool.alive
    assert all(not p.is_alive() for p in procs)


@pytest.mark.parametrize("bad", [0, -1, 2.0, True])
def test_world_size_must_be_a_positive_int(bad):
    with pytest.raises(RuntimeShellError, match="world_size"):
        WorkerPool(bad)


def test_fork_start_method_is_refused():
    with pytest.raises(RuntimeShellError, match="fork"):
        WorkerPool(2, start_method="fork")
