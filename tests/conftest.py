"""Shared fixtures: one loopback-only Ray instance for the whole test session."""

from __future__ import annotations

import pytest
import ray

from bastion.launcher import ensure_ray


@pytest.fixture(scope="session")
def ray_session():
    ensure_ray()
    yield
    ray.shutdown()
