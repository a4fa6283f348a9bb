"""Shared test configuration: hypothesis profiles ``dev`` (default), ``ci`` and ``thorough``
(1,000 examples per property, for a long local run), and the
long-lived gloo worker pools every multi-process test shares (one per world size)."""

import os

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "dev",
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "ci",
    max_examples=100,
    deadline=None,
    derandomize=True,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "thorough",
    max_examples=1000,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))


@pytest.fixture(scope="session")
def fake_world():
    """One fake torch.distributed default group (rank 0) shared by all oracle tests.

    See ``tests/_torch_oracle.py``; returns its world size.
    """
    from _torch_oracle import ensure_fake_world

    return ensure_fake_world()


# -- multi-process tests: one long-lived gloo worker pool per world size ----------------
# Pools start on the first test that uses them and are reused by every later test, in every
# test folder; a task that fails makes its pool restart before the next task.


def _pool(world_size):
    from meshplan.runtime._pool import WorkerPool

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
