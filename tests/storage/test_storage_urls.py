"""open_store: URL parsing, specific errors for bad URLs, and secrets kept out of sight."""

from __future__ import annotations

import logging
import os
import pickle
from typing import TYPE_CHECKING

import pytest

from bastion.storage import (
    InvalidStoreURLError,
    LocalStore,
    MinioStore,
    StorageError,
    StoreUnavailableError,
    open_store,
)

if TYPE_CHECKING:
    from conftest import S3Target


@pytest.mark.parametrize("url, expected", [
    ("ftp://x", "unknown scheme 'ftp' in 'ftp://x': use local://PATH or "
                "s3://BUCKET/PREFIX?endpoint=HOST:PORT"),
    ("", "empty storage URL"),
    (".bastion", "has no scheme"),
    ("local://", "no directory in 'local://'"),
    ("local://d?fsync=maybe", "invalid fsync='maybe'"),
    ("local://d?fsynk=true", "unknown parameter 'fsynk'"),
    ("s3://?endpoint=h:9000", "no bucket in 's3://?endpoint=h:9000'"),
    ("s3://B_ad/p?endpoint=h:9000", "invalid bucket name 'B_ad'"),
    ("s3://bucket/p", "no endpoint in 's3://bucket/p': add ?endpoint=HOST:PORT"),
    ("s3://bucket/p?endpoint=http://h:9000", "give HOST:PORT without a scheme"),
    ("s3://bucket/p?endpoint=h:port", "expected HOST:PORT"),
    ("s3://bucket/p?endpoint=h:9000&retry_attempts=many", "invalid retry_attempts='many'"),
    ("s3://bucket/p?endpoint=h:9000&retry_attempts=0", "retry_attempts must be >= 1"),
    ("s3://bucket/p?endpoint=h:9000&part_size_bytes=1024", "part_size_bytes must be >= "),
    ("s3://bucket/p?endpoint=h:9000&secure=false&secure=true", "given twice"),
    ("s3://bucket/a//b?endpoint=h:9000", "invalid object key"),
])
def test_bad_urls_give_specific_errors(url: str, expected: str, s3_env: S3Target,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("BASTION_S3_ENDPOINT", raising=False)
    with pytest.raises(InvalidStoreURLError) as info:
        open_store(url)
    assert expected in str(info.value)
    assert isinstance(info.value, StorageError)


def test_local_url_resolves_relative_paths_against_cwd(tmp_path: os.PathLike[str],
                                                       monkeypatch: pytest.MonkeyPatch,
                                                       ) -> None:
    monkeypatch.chdir(tmp_path)
    store = open_store("local://.bastion/data")
    assert isinstance(store, LocalStore)
    assert store.root == os.path.join(str(tmp_path), ".bastion", "data")
    store.put("k", b"v")
    assert (tmp_path / ".bastion" / "data" / "k").read_bytes() == b"v"
    assert store.url == f"local://{store.root}"


def test_local_fsync_option(tmp_path: os.PathLike[str]) -> None:
    store = open_store(f"local://{tmp_path}?fsync=true")
    store.put("a/b", b"synced")
    assert store.get("a/b") == b"synced"
    assert store.url.endswith("?fsync=true")
    assert pickle.loads(pickle.dumps(store)).url == store.url


def test_local_store_on_unwritable_path_names_it(tmp_path: os.PathLike[str]) -> None:
    blocker = tmp_path / "file"
    blocker.write_bytes(b"")
    with pytest.raises(StorageError) as info:
        open_store(f"local://{blocker}/sub")
    assert str(blocker) in str(info.value) and "writable path" in str(info.value)


def test_unreachable_endpoint_fails_at_open(s3_env: S3Target, closed_port: int) -> None:
    url = (f"s3://bucket-x/p?endpoint=127.0.0.1:{closed_port}&secure=false"
           "&retry_attempts=2&retry_base_delay_s=0.01")
    with pytest.raises(StoreUnavailableError) as info:
        open_store(url)  # gives up after its attempts (attempts == 2 below), no hang
    message = str(info.value)
    assert "s3://bucket-x/p?endpoint=127.0.0.1:" in message
    assert "after 2 attempts" in message and "reachable" in message
    assert info.value.attempts == 2 and info.value.operation == "open"


def test_missing_credentials_say_which_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("BASTION_S3_ACCESS_KEY", "BASTION_S3_SECRET_KEY", "AWS_ACCESS_KEY_ID",
                "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(StorageError) as info:
        open_store("s3://bucket/p?endpoint=127.0.0.1:9&secure=false")
    assert "BASTION_S3_ACCESS_KEY" in str(info.value)
    assert "s3://bucket/p?endpoint=127.0.0.1:9" in str(info.value)


def test_aws_variables_are_a_fallback(s3_target: S3Target,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("BASTION_S3_ACCESS_KEY", raising=False)
    monkeypatch.delenv("BASTION_S3_SECRET_KEY", raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3_target.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3_target.secret_key)
    store = open_store(s3_target.url("aws-fallback"))
    store.put("k", b"v")
    assert store.get("k") == b"v"


def test_credentials_in_url_are_refused_without_echoing_them(s3_env: S3Target) -> None:
    with pytest.raises(InvalidStoreURLError) as info:
        open_store(f"s3://{s3_env.access_key}:{s3_env.secret_key}@bucket/p?endpoint=h:1")
    message = str(info.value)
    assert s3_env.secret_key not in message and s3_env.access_key not in message
    assert "s3://***@bucket/p" in message and "BASTION_S3_SECRET_KEY" in message


def test_secrets_never_shown(s3_env: S3Target, closed_port: int,
                             caplog: pytest.LogCaptureFixture) -> None:
    store = open_store(s3_env.url("secrets"))
    assert isinstance(store, MinioStore)
    shown = [repr(store), str(store), store.url, repr(vars(store))]
    down = MinioStore("bucket-y", "p", endpoint=f"127.0.0.1:{closed_port}", secure=False,
                      retry_attempts=2, retry_base_delay_s=0.01)
    with caplog.at_level(logging.DEBUG):
        with pytest.raises(StoreUnavailableError) as info:
            down.put("k", b"v")
    shown += [str(info.value), repr(info.value), caplog.text]
    assert "retrying" in caplog.text  # the retry was logged...
    for text in shown:                 # ...and nothing shows a secret
        assert s3_env.secret_key not in text
        assert s3_env.access_key not in text


def test_a_storage_error_is_a_bastion_error(tmp_path) -> None:
    # what the command line and a user's `except bn.BastionError` rely on
    import bastion

    blocker = tmp_path / "file"
    blocker.write_bytes(b"")
    with pytest.raises(bastion.BastionError) as info:
        open_store(f"local://{blocker}/sub")
    assert isinstance(info.value, StorageError)
    assert issubclass(InvalidStoreURLError, bastion.BastionError)


def test_secrets_are_hidden_whole_and_the_rest_stays_readable():
    from bastion.storage.store import scrub_secrets

    # a short key inside a longer word is not the key
    assert scrub_secrets("s3://bucket/prefix failed", ["x", "bo"]) == \
        "s3://bucket/prefix failed"
    # a key where it stands alone is hidden, character for character
    assert scrub_secrets("denied for AKIA123 with secret s3cr/et+K", ["AKIA123", "s3cr/et+K"]) \
        == "denied for ******* with secret *********"
    assert scrub_secrets("key=AKIA123&x=1", ["AKIA123"]) == "key=*******&x=1"
    assert scrub_secrets("nothing here", [""]) == "nothing here"
