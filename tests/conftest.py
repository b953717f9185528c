"""Shared fixtures: one loopback-only Ray instance, one Spark session and one S3 test
server for the whole test session, each started only when a test asks for it."""

from __future__ import annotations

import logging

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


@pytest.fixture(scope="session")
def moto_endpoint():
    """``host:port`` of an S3 server (moto) on 127.0.0.1, speaking the real wire
    protocol; tests name their own buckets."""
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    yield f"127.0.0.1:{server.get_host_and_port()[1]}"
    server.stop()
