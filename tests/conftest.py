"""Shared test configuration: hypothesis profiles ``dev`` (default) and ``ci``."""

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
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))


@pytest.fixture(scope="session")
def fake_world():
    """One fake torch.distributed default group (rank 0) shared by all oracle tests.

    See ``tests/_torch_oracle.py``; returns its world size.
    """
    from _torch_oracle import ensure_fake_world

    return ensure_fake_world()
