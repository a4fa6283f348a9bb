"""Multi-process fixtures: one long-lived gloo worker pool per world size per test session.

The pools start on the first test that uses them (forking workers from a server that has
imported torch once takes about a second) and are reused by every later test; a test
whose task fails makes its pool restart before the next task (a fraction of a second).
Tasks are module-level functions of the test modules: the workers find them because the
parent's ``sys.path`` travels with every task.
"""

import pytest

from meshplan.redistribute._pool import WorkerPool


def _pool(world_size):
    pool = WorkerPool(
        world_size, "gloo", timeout=60.0, pg_timeout=30.0, preload=("pytest", "hypothesis")
    )
    yield pool
    pool.shutdown()


@pytest.fixture(scope="session")
def pool4():
    """A 4-rank gloo world."""
    yield from _pool(4)


@pytest.fixture(scope="session")
def pool8():
    """An 8-rank gloo world."""
    yield from _pool(8)


@pytest.fixture(scope="session", params=[4, 8], ids=["world4", "world8"])
def pool(request):
    """Each of the two worlds in turn."""
    return request.getfixturevalue(f"pool{request.param}")
