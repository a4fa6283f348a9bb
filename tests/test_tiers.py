"""The test configuration (``tests/conftest.py``) under pytest-xdist, as CI runs it: every test
of the shared gloo pools in one worker; the other gloo tests, then the slow ones, handed out
before the quick ones."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest

_SUITE = """
from multiprocessing import get_context

import pytest


@pytest.fixture
def stub_pool():  # named like a pool: the configuration puts its tests in the gloo tier
    return None


@pytest.mark.parametrize("i", range(4))
def test_quick(i):
    pass


@pytest.mark.parametrize("i", range(4))
def test_gloo(stub_pool, i):
    pass


@pytest.mark.parametrize("i", range(2))
def test_own_processes(i):  # starts processes of its own: gloo tier, but no shared pool
    assert get_context


@pytest.mark.slow
def test_slow():
    pass
"""


@pytest.mark.slow  # three pytest processes: seconds
def test_two_workers_run_the_pools_tests_in_one_and_start_the_other_on_the_long_tests(tmp_path):
    shutil.copy(os.path.join(os.path.dirname(__file__), "conftest.py"), tmp_path)
    (tmp_path / "test_suite.py").write_text(_SUITE)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "-v", "-p", "no:cacheprovider", "-W",
         "ignore::pytest.PytestUnknownMarkWarning", "test_suite.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    ran = re.findall(r"^\[(gw\d)\] \[\s*\d+%\] PASSED test_suite\.py::(\S+)", done.stdout, re.M)
    assert len(ran) == 11, done.stdout
    # each test of the pools named after its group: one unit of work, so one worker
    gloo = {worker for worker, test in ran if test.startswith("test_gloo")}
    assert all(test.endswith("]@gloo") for _, test in ran if test.startswith("test_gloo"))
    assert len(gloo) == 1, ran
    # the other worker starts with the module that starts processes (one unit), then the slow
    # test, then quick ones
    other = [test for worker, test in ran if worker not in gloo]
    assert other[:3] == [
        "test_own_processes[0]@test_suite.py",
        "test_own_processes[1]@test_suite.py",
        "test_slow",
    ], ran
