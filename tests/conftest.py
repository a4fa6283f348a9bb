"""Shared test configuration: hypothesis profiles ``dev`` (default), ``ci`` and ``thorough``
(1,000 examples per property, for a long local run), the
long-lived gloo worker pools every multi-process test shares (one per world size), and the
``distributed`` marker on every test that runs processes of a gloo world, so that
``pytest -m "not distributed"`` runs the pure tier alone."""

import os
import re

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


# -- tiers: ``distributed`` marks every test that runs a gloo world -----------------------

_POOL = re.compile(r"(.*_)?pool\d*")
_EXAMPLES = os.path.join(os.path.dirname(__file__), "examples")


def _starts_processes(item) -> bool:
    """Whether the test asks for a worker pool, starts one (or other processes) itself, or
    runs an example script on gloo ranks."""
    if any(_POOL.fullmatch(name) for name in getattr(item, "fixturenames", ())):
        return True
    if str(item.path).startswith(_EXAMPLES):
        return True
    code = getattr(getattr(item, "function", None), "__code__", None)
    names = set(code.co_names) if code is not None else set()
    return bool(names & {"get_context", "start_processes"}) or {"WorkerPool", "run"} <= names


def pytest_collection_modifyitems(config, items):
    for item in items:
        if _starts_processes(item):
            item.add_marker(pytest.mark.distributed)
