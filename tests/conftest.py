"""Shared test configuration: hypothesis profiles ``dev`` (the default: 20 examples per
property, random), ``ci`` (100, derandomized: what CI runs) and ``thorough`` (1,000, for a
long local run), the long-lived gloo worker pools every multi-process test shares (one per
world size), and the test tiers.

Tiers (markers registered in ``pyproject.toml``; a plain ``pytest tests`` runs all three):

- quick: ``pytest -m "not distributed and not slow" tests`` -- every other pure test (each
  well under a few seconds): run it often.
- ``slow``: pure tests that are expensive by design -- brute-force optimality (every spec of
  a mesh, Dijkstra over all of them), exhaustive comparisons of the search with plan tables
  and with its heuristic, whole programs planned and simulated (a transformer on a 3-D mesh),
  sweeps against torch as an oracle (in process on a fake group, or in a subprocess).
  ``pytest -m "not distributed" tests`` runs them with the quick tier.
- ``distributed``: every test that runs processes of a gloo world (set here, from what the
  test asks for: see :func:`_starts_processes`); ``pytest -m distributed tests``.
"""

import gc
import os
import re

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "dev",
    max_examples=20,
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


#: what the fork server imports once for every worker of every pool (and every restart of
#: one): the test tools, the planner, and transformers' models where installed (~5 s of CPU
#: per import: the model tests and the training guide would otherwise pay it on every rank)
PRELOAD = ("pytest", "hypothesis", "meshplan.runtime", "meshplan.strategy", "meshplan.checkpoint")


def _pool(world_size):
    import importlib.util

    from meshplan.runtime._pool import WorkerPool

    models = importlib.util.find_spec("transformers") is not None
    preload = PRELOAD + (("transformers.modeling_utils",) if models else ())
    pool = WorkerPool(world_size, "gloo", timeout=60.0, pg_timeout=30.0, preload=preload)
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

GLOO_GROUP = "gloo"
_POOL = re.compile(r"(.*_)?pool\d*")
_EXAMPLES = os.path.join(os.path.dirname(__file__), "examples")


def _uses_pool(item) -> bool:
    """Whether the test asks for a worker pool, as an argument or by name through
    ``request.getfixturevalue``."""
    if any(_POOL.fullmatch(name) for name in getattr(item, "fixturenames", ())):
        return True
    code = getattr(getattr(item, "function", None), "__code__", None)
    return (
        code is not None
        and "getfixturevalue" in code.co_names
        and any(isinstance(c, str) and _POOL.fullmatch(c) for c in code.co_consts)
    )


def _starts_processes(item) -> bool:
    """Whether the test uses a worker pool, starts one (or other processes) itself, or runs
    an example script on gloo ranks."""
    if _uses_pool(item) or str(item.path).startswith(_EXAMPLES):
        return True
    code = getattr(getattr(item, "function", None), "__code__", None)
    names = set(code.co_names) if code is not None else set()
    return bool(names & {"get_context", "start_processes"}) or {"WorkerPool", "run"} <= names


def pytest_configure(config):
    # ``-n N`` alone distributes test by test (``--dist load``): each worker would start its
    # own gloo pools; group them instead (see below)
    if getattr(config.option, "numprocesses", None) and config.option.dist == "load":
        config.option.dist = "loadgroup"
    # a worker reads the command line afresh (``-n 2``: no ``--dist``), so it would not name
    # its tests after their groups; its controller tells it to (below)
    if getattr(config, "workerinput", {}).get("loadgroup"):
        config.option.loadgroup = True


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    node.workerinput["loadgroup"] = node.config.option.dist == "loadgroup"


# A wrapper around every other implementation of this hook. Before them: the marks, because a
# pytest-xdist worker names each test after its xdist_group in its own implementation (marked
# later, each gloo test would be a unit of its own, and both workers would start pools). After
# them (pytest's own ordering by fixtures included): under xdist, the gloo group
# first, then the other distributed tests, the slow tests and the quick ones (each kind in
# collection order). xdist hands out units in collection order; starting with the long ones
# lets the two workers finish together, instead of one running a minute-long test alone at
# the end.
@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_collection_modifyitems(config, items):
    for item in items:
        if not _starts_processes(item):
            continue
        item.add_marker(pytest.mark.distributed)
        # under pytest-xdist (``-n 2 --dist loadgroup``, as CI runs) every test of the shared
        # pools goes to one worker, so that each pool starts once; the tests that start
        # processes of their own (example scripts, their own WorkerPool) go to either worker,
        # a module's together (their module fixtures run an example once), and the pure
        # tests are shared by both workers
        group = GLOO_GROUP if _uses_pool(item) else item.nodeid.split("::")[0]
        item.add_marker(pytest.mark.xdist_group(group))
    result = yield
    if hasattr(config, "workerinput"):
        items.sort(key=_longest_first)
    return result


def _longest_first(item) -> int:
    if item.get_closest_marker("distributed"):
        return 0 if _uses_pool(item) else 1
    return 2 if item.get_closest_marker("slow") else 3


# -- garbage collection ------------------------------------------------------------------
# A search or a brute force builds millions of objects that live as long as one example;
# with the default thresholds each of them is traversed again and again by collections
# (about 30% of the pure tier's time). Everything imported and collected so far is frozen
# (never traversed again), and young collections run every 50,000 allocations instead of
# 700: cyclic garbage is still collected, in fewer, larger batches.


def pytest_collection_finish(session):
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 20)


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session):
    # pytest collects five times more after this (to report exceptions raised in
    # finalizers), each a traversal of every memo the planner built: collect once, then
    # freeze what is left so that those collections find nothing to traverse
    gc.collect()
    gc.freeze()
