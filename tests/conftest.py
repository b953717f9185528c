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


@pytest.fixture(scope="session")
def spark():
    """One local SparkSession (``local[2]``) for the whole test session: a JVM start
    costs seconds, so every Spark test shares it. Started the first time a test asks
    for it (a run without Spark tests never starts a JVM), stopped at the end."""
    from bastion.spark_jobs.session import build_session

    session = build_session(app_name="bastion-tests")
    yield session
    session.stop()
