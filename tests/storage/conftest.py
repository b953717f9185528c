"""Fixtures for the storage tests.

Every test that takes ``store`` runs twice: on a :class:`LocalStore` in a temporary
directory and on a :class:`MinioStore` speaking the real S3 wire protocol to moto's
standalone server on 127.0.0.1 (started once per session). To run the same suite
against a real MinIO instead (deploy/docker-compose.yml, with the credentials of
your deploy/bastion.env)::

    BASTION_TEST_S3_ENDPOINT=127.0.0.1:9000 \\
    BASTION_S3_ACCESS_KEY=... BASTION_S3_SECRET_KEY=... \\
    .venv/bin/python -m pytest tests/storage

Fault tests that stop the server always start their own moto server, so they never
disturb the shared one (or a real MinIO).
"""

from __future__ import annotations

import logging
import os
import socket
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from bastion.storage import LocalStore, ObjectStore, open_store

# Fake credentials for moto; chosen to be easy to spot if they ever leak into a message.
MOTO_ACCESS_KEY = "AKIABASTIONTESTKEY"
MOTO_SECRET_KEY = "bastion-test-secret-DO-NOT-LEAK"
TEST_BUCKET = os.environ.get("BASTION_TEST_S3_BUCKET", "bastion-test")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MotoServer:
    """moto's S3 server in this process; stop/start keep its data (moto's state is
    per process), like a MinIO restart keeps its disks."""

    access_key = MOTO_ACCESS_KEY
    secret_key = MOTO_SECRET_KEY

    def __init__(self, port: int = 0) -> None:
        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
        self._server.start()
        self.port = self._server.get_host_and_port()[1]
        self.running = True

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def stop(self) -> None:
        if self.running:
            self._server.stop()
            self.running = False

    def restart(self) -> None:
        from moto.server import ThreadedMotoServer

        self.stop()
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port,
                                          verbose=False)
        self._server.start()
        self.running = True


@dataclass(frozen=True)
class S3Target:
    endpoint: str
    secure: bool
    access_key: str
    secret_key: str

    def url(self, prefix: str, **params: object) -> str:
        query = "&".join([f"endpoint={self.endpoint}",
                          f"secure={'true' if self.secure else 'false'}"]
                         + [f"{k}={v}" for k, v in params.items()])
        return f"s3://{TEST_BUCKET}/{prefix}?{query}"


@pytest.fixture(scope="session")
def s3_target() -> Iterator[S3Target]:
    endpoint = os.environ.get("BASTION_TEST_S3_ENDPOINT")
    if endpoint:
        yield S3Target(endpoint,
                       os.environ.get("BASTION_TEST_S3_SECURE", "false").lower() == "true",
                       os.environ["BASTION_S3_ACCESS_KEY"],
                       os.environ["BASTION_S3_SECRET_KEY"])
        return
    server = MotoServer()
    yield S3Target(server.endpoint, False, MOTO_ACCESS_KEY, MOTO_SECRET_KEY)
    server.stop()


@pytest.fixture
def s3_env(s3_target: S3Target, monkeypatch: pytest.MonkeyPatch) -> S3Target:
    """Credentials in the environment, as open_store reads them."""
    monkeypatch.setenv("BASTION_S3_ACCESS_KEY", s3_target.access_key)
    monkeypatch.setenv("BASTION_S3_SECRET_KEY", s3_target.secret_key)
    return s3_target


@pytest.fixture
def closed_port() -> int:
    """A loopback port nothing listens on."""
    return free_port()


@pytest.fixture
def own_moto(monkeypatch: pytest.MonkeyPatch) -> Iterator[MotoServer]:
    """A private moto server a test may stop and restart."""
    monkeypatch.setenv("BASTION_S3_ACCESS_KEY", MOTO_ACCESS_KEY)
    monkeypatch.setenv("BASTION_S3_SECRET_KEY", MOTO_SECRET_KEY)
    server = MotoServer(free_port())
    yield server
    server.stop()


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: os.PathLike[str]) -> Iterator[ObjectStore]:
    """A fresh, empty store: a temporary directory, or a unique prefix of the S3
    test bucket."""
    if request.param == "local":
        yield LocalStore(tmp_path)
        return
    target: S3Target = request.getfixturevalue("s3_env")
    s3 = open_store(target.url(f"t-{uuid.uuid4().hex[:12]}", retry_attempts=3,
                               retry_base_delay_s=0.05))
    yield s3
    s3.close()
