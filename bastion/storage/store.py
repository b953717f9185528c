"""Object stores: the one place Bastion's bytes live.

An *object store* maps keys (``/``-separated names such as
``jobs/wc/logs/count/0/seg-00000000000000000000``) to immutable byte strings. Everything
durable in Bastion — output logs, checkpoints, metrics — is built from five calls:
``put`` a whole object, ``get`` it (optionally a byte range), ``list`` keys by prefix,
``delete`` and ``exists``/``size``. There is no append and no rename: an object is
written whole, atomically, or not at all. Readers therefore never see half an object,
and the layers above (:mod:`bastion.storage.log`, :mod:`bastion.storage.checkpoints`)
get crash safety by writing new objects and then a small object that points at them.

Two implementations share one test suite:

* :class:`LocalStore` (``local://PATH``) — a directory, the embedded default. A put
  writes a temporary file and renames it over the key's path, so a crash leaves the
  old object or the new one, never a mix. With ``fsync=True`` the file and its
  directory are fsynced, making the object survive power loss, not just a process
  crash.
* :class:`MinioStore` (``s3://BUCKET/PREFIX?endpoint=HOST:PORT``) — any S3-compatible
  service (MinIO, AWS S3, moto) through the official ``minio`` SDK. Credentials come
  from ``BASTION_S3_ACCESS_KEY``/``BASTION_S3_SECRET_KEY`` (or ``AWS_ACCESS_KEY_ID``/
  ``AWS_SECRET_ACCESS_KEY``) and never appear in URLs, reprs, logs or error messages.
  Connection errors and 5xx answers are retried with exponential backoff and jitter;
  when the attempts run out the call raises :class:`StoreUnavailableError`.

Both are picklable (they travel to Ray actors); network clients are rebuilt lazily
after unpickling. Every call has an ``a``-prefixed coroutine twin (``aput``, ``aget``,
...) that runs the blocking call in a worker thread, so async actors keep their event
loop free.

Keys are validated the same way on both stores so that a layout that works locally
works on S3: non-empty ``/``-separated names, no empty, ``.`` or ``..`` components, no
leading ``/``. On a local directory a key cannot also be a "directory" of other keys
(``a`` and ``a/b`` cannot both exist); Bastion's layouts never need that.
"""

from __future__ import annotations

import abc
import asyncio
import builtins
import io
import logging
import os
import random
import re
import threading
import time
import uuid
from types import MappingProxyType
from typing import Any, Callable, Iterable, Mapping, TypeVar
from urllib.parse import parse_qs, urlsplit

from .errors import (
    InvalidStoreURLError,
    KeyNotFoundError,
    StorageError,
    StoreUnavailableError,
)

__all__ = ["ObjectStore", "LocalStore", "MinioStore", "open_store"]

_log = logging.getLogger(__name__)
_T = TypeVar("_T")

_URL_HELP = "use local://PATH or s3://BUCKET/PREFIX?endpoint=HOST:PORT"
# LocalStore stages writes here; the name is reserved as a first key component.
_TMP_DIR = ".tmp"
_MIB = 1024 * 1024
# S3 refuses multipart parts below 5 MiB (except the last one).
_MIN_PART_SIZE_BYTES = 5 * _MIB
_MAX_PARTS = 10_000


def _check_key(key: str) -> None:
    if not isinstance(key, str) or not key:
        raise ValueError(f"object key must be a non-empty string, got {key!r}")
    parts = key.split("/")
    if any(p in ("", ".", "..") for p in parts) or "\x00" in key:
        raise ValueError(
            f"invalid object key {key!r}: use '/'-separated names without empty, "
            "'.' or '..' components and without a leading or trailing '/'")
    if parts[0] == _TMP_DIR:
        raise ValueError(f"invalid object key {key!r}: '{_TMP_DIR}/' is reserved")


def _check_prefix(prefix: str) -> None:
    if not isinstance(prefix, str) or prefix.startswith("/") or "\x00" in prefix:
        raise ValueError(f"invalid key prefix {prefix!r}")
    if any(p in (".", "..") for p in prefix.split("/")):
        raise ValueError(f"invalid key prefix {prefix!r}: no '.' or '..' components")


def _check_range(offset: int, length: int | None) -> None:
    if offset < 0 or (length is not None and length < 0):
        raise ValueError(f"invalid byte range offset={offset} length={length}")


class ObjectStore(abc.ABC):
    """Keys → immutable byte strings; see the module docstring for the contract.

    ``put`` replaces the whole object atomically; ``delete`` is idempotent (deleting a
    missing key is not an error); ``get``/``size`` raise :class:`KeyNotFoundError`
    for a missing key; ``list`` returns every key starting with ``prefix``, sorted.
    """

    #: The ranged-read size that streams fastest: small enough to stay in CPU caches
    #: locally, large enough to amortise a round trip over the network.
    preferred_read_bytes: int = 256 * 1024

    @property
    @abc.abstractmethod
    def url(self) -> str:
        """The store's URL, without credentials; ``open_store(url)`` reopens it."""

    @abc.abstractmethod
    def put(self, key: str, data: bytes | bytearray | memoryview) -> None:
        """Store ``data`` under ``key``, replacing any previous object atomically."""

    @abc.abstractmethod
    def get(self, key: str, offset: int = 0, length: int | None = None) -> bytes:
        """Return the object's bytes ``[offset, offset+length)`` (to the end if
        ``length`` is None); a range past the end yields the bytes that exist."""

    @abc.abstractmethod
    def list(self, prefix: str = "") -> list[str]:
        """Every key that starts with ``prefix``, sorted."""

    @abc.abstractmethod
    def list_sizes(self, prefix: str = "") -> dict[str, int]:
        """Every key that starts with ``prefix`` with its size in bytes (one listing,
        no per-key round trip)."""

    @abc.abstractmethod
    def list_modified(self, prefix: str = "") -> dict[str, float]:
        """Every key that starts with ``prefix`` with the time it was last written
        (seconds since the epoch): what retention ranks old jobs by."""

    @abc.abstractmethod
    def delete(self, key: str) -> None:
        """Remove ``key``; a missing key is not an error."""

    @abc.abstractmethod
    def exists(self, key: str) -> bool:
        """Whether ``key`` names an object."""

    @abc.abstractmethod
    def size(self, key: str) -> int:
        """The object's size in bytes."""

    def close(self) -> None:
        """Release network resources; the store reconnects if used again."""

    async def aput(self, key: str, data: bytes | bytearray | memoryview) -> None:
        await asyncio.to_thread(self.put, key, data)

    async def aget(self, key: str, offset: int = 0, length: int | None = None) -> bytes:
        return await asyncio.to_thread(self.get, key, offset, length)

    async def alist(self, prefix: str = "") -> builtins.list[str]:  # not ``self.list``
        return await asyncio.to_thread(self.list, prefix)

    async def alist_sizes(self, prefix: str = "") -> dict[str, int]:
        return await asyncio.to_thread(self.list_sizes, prefix)

    async def adelete(self, key: str) -> None:
        await asyncio.to_thread(self.delete, key)

    async def aexists(self, key: str) -> bool:
        return await asyncio.to_thread(self.exists, key)

    async def asize(self, key: str) -> int:
        return await asyncio.to_thread(self.size, key)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"


# --------------------------------------------------------------------------- local


class LocalStore(ObjectStore):
    """A directory as an object store (``local://PATH``).

    Writes go to ``PATH/.tmp/`` and are renamed into place, so every put is atomic.
    ``fsync=True`` additionally fsyncs the file before the rename and the directory
    after it: slower, but an acknowledged put then survives power loss.
    """

    def __init__(self, root: str | os.PathLike[str], *, fsync: bool = False) -> None:
        self._root = os.path.abspath(os.path.expanduser(os.fspath(root)))
        self._fsync = fsync
        self._tmp = os.path.join(self._root, _TMP_DIR)
        try:
            os.makedirs(self._tmp, exist_ok=True)
        except OSError as e:
            raise StorageError(
                f"cannot create the local store directory for {self.url}: "
                f"{e.strerror or e}; choose a writable path") from e

    @property
    def root(self) -> str:
        return self._root

    @property
    def url(self) -> str:
        return f"local://{self._root}" + ("?fsync=true" if self._fsync else "")

    def _path(self, key: str) -> str:
        _check_key(key)
        return os.path.join(self._root, *key.split("/"))

    def _fail(self, op: str, key: str, e: OSError) -> StorageError:
        return StorageError(f"{self.url}: {op} {key!r} failed: {e.strerror or e}")

    def put(self, key: str, data: bytes | bytearray | memoryview) -> None:
        path = self._path(key)
        tmp = os.path.join(self._tmp, uuid.uuid4().hex)
        try:
            self._write_tmp(tmp, data)
            # A concurrent delete may prune the (empty) parent directory between
            # makedirs and the rename; recreate it and rename again.
            for attempt in range(3):
                try:
                    os.replace(tmp, path)
                    break
                except FileNotFoundError:
                    if attempt == 2:
                        raise
                    os.makedirs(os.path.dirname(path), exist_ok=True)
            if self._fsync:
                _fsync_dir(os.path.dirname(path))
        except OSError as e:
            _unlink_quietly(tmp)
            raise self._fail("put", key, e) from e

    def _write_tmp(self, tmp: str, data: bytes | bytearray | memoryview) -> None:
        try:
            f = open(tmp, "wb")
        except FileNotFoundError:
            # The staging directory was removed behind our back (e.g. rm -r of the
            # store while a pickled copy lived on); recreate it.
            os.makedirs(self._tmp, exist_ok=True)
            f = open(tmp, "wb")
        with f:
            f.write(data)
            if self._fsync:
                f.flush()
                os.fsync(f.fileno())

    def get(self, key: str, offset: int = 0, length: int | None = None) -> bytes:
        _check_range(offset, length)
        path = self._path(key)
        try:
            with open(path, "rb") as f:
                if offset:
                    f.seek(offset)
                return f.read() if length is None else f.read(length)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise KeyNotFoundError(f"{self.url}: no object {key!r}", key) from None
        except OSError as e:
            raise self._fail("get", key, e) from e

    def _walk(self, prefix: str) -> list[tuple[str, os.DirEntry[str]]]:
        _check_prefix(prefix)
        dir_part, _, name_part = prefix.rpartition("/")
        start = os.path.join(self._root, *dir_part.split("/")) if dir_part else self._root
        base = dir_part + "/" if dir_part else ""
        found: list[tuple[str, os.DirEntry[str]]] = []
        stack = [(start, base, name_part)]
        while stack:
            path, rel, must_start = stack.pop()
            try:
                entries = list(os.scandir(path))
            except (FileNotFoundError, NotADirectoryError):
                continue
            except OSError as e:
                raise self._fail("list", prefix, e) from e
            for entry in entries:
                if must_start and not entry.name.startswith(must_start):
                    continue
                if entry.is_dir(follow_symlinks=False):
                    if rel == "" and entry.name == _TMP_DIR:
                        continue
                    stack.append((entry.path, rel + entry.name + "/", ""))
                elif entry.is_file(follow_symlinks=False):
                    found.append((rel + entry.name, entry))
        return found

    def list(self, prefix: str = "") -> list[str]:
        return sorted(key for key, _ in self._walk(prefix))

    def list_sizes(self, prefix: str = "") -> dict[str, int]:
        sizes: dict[str, int] = {}
        for key, entry in sorted(self._walk(prefix), key=lambda kv: kv[0]):
            try:
                sizes[key] = entry.stat(follow_symlinks=False).st_size
            except FileNotFoundError:
                continue  # deleted since the directory was scanned
        return sizes

    def list_modified(self, prefix: str = "") -> dict[str, float]:
        times: dict[str, float] = {}
        for key, entry in sorted(self._walk(prefix), key=lambda kv: kv[0]):
            try:
                times[key] = entry.stat(follow_symlinks=False).st_mtime
            except FileNotFoundError:
                continue  # deleted since the directory was scanned
        return times

    def delete(self, key: str) -> None:
        path = self._path(key)
        try:
            os.unlink(path)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return
        except OSError as e:
            raise self._fail("delete", key, e) from e
        # Prune directories the delete emptied, so GC'd checkpoints leave no husks.
        parent = os.path.dirname(path)
        while parent != self._root and parent.startswith(self._root):
            try:
                os.rmdir(parent)
            except OSError:
                break
            parent = os.path.dirname(parent)

    def exists(self, key: str) -> bool:
        return os.path.isfile(self._path(key))

    def size(self, key: str) -> int:
        path = self._path(key)
        try:
            st = os.stat(path)
        except (FileNotFoundError, NotADirectoryError):
            raise KeyNotFoundError(f"{self.url}: no object {key!r}", key) from None
        if not os.path.isfile(path):
            raise KeyNotFoundError(f"{self.url}: no object {key!r}", key)
        return st.st_size


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


# --------------------------------------------------------------------------- S3 / MinIO

# S3 error codes that mean "try again": the request was fine, the service was not.
_RETRYABLE_S3_CODES = frozenset({
    "InternalError", "ServiceUnavailable", "SlowDown", "RequestTimeout",
    "RequestTimeTooSkewed", "OperationAborted", "XMinioServerNotInitialized",
})


# MinioStore's tunables and their defaults; a store's URL names those it changes.
_S3_DEFAULTS: Mapping[str, Any] = MappingProxyType({
    "region": "us-east-1", "retry_attempts": 5, "retry_base_delay_s": 0.2,
    "retry_max_delay_s": 5.0, "timeout_s": 30.0, "part_size_bytes": 16 * _MIB,
})


def _env_credentials() -> tuple[str | None, str | None]:
    for ak_var, sk_var in (("BASTION_S3_ACCESS_KEY", "BASTION_S3_SECRET_KEY"),
                           ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")):
        ak, sk = os.environ.get(ak_var), os.environ.get(sk_var)
        if ak and sk:
            return ak, sk
    return None, None


class _Secret:
    """Holds a credential; its repr never shows it (tracebacks, debuggers, logs)."""

    __slots__ = ("value",)

    def __init__(self, value: str) -> None:
        self.value = value

    def __repr__(self) -> str:
        return "<secret>"

    def __reduce__(self) -> tuple[Any, ...]:
        return (_Secret, (self.value,))


class MinioStore(ObjectStore):
    """An S3 bucket (optionally under a key prefix) through the ``minio`` SDK.

    ``retry_attempts`` counts tries, not retries: 1 means no retry. The delay before
    try *n+1* is drawn uniformly from ``[d/2, d]`` with
    ``d = min(retry_max_delay_s, retry_base_delay_s * 2**(n-1))`` — exponential, with
    jitter so that many instances that lost the store together do not hammer it in
    lockstep when it returns. ``timeout_s`` bounds connecting and each socket read.
    Objects larger than ``part_size_bytes`` are uploaded in parts (multipart upload).
    """

    # A GET costs milliseconds whatever its size: read in large ranges.
    preferred_read_bytes = 4 * _MIB

    def __init__(self, bucket: str, prefix: str = "", *, endpoint: str,
                 secure: bool = True, region: str = _S3_DEFAULTS["region"],
                 access_key: str | None = None, secret_key: str | None = None,
                 retry_attempts: int = _S3_DEFAULTS["retry_attempts"],
                 retry_base_delay_s: float = _S3_DEFAULTS["retry_base_delay_s"],
                 retry_max_delay_s: float = _S3_DEFAULTS["retry_max_delay_s"],
                 timeout_s: float = _S3_DEFAULTS["timeout_s"],
                 part_size_bytes: int = _S3_DEFAULTS["part_size_bytes"]) -> None:
        from minio.helpers import check_bucket_name

        prefix = prefix.strip("/")
        self._bucket = bucket
        self._prefix = prefix + "/" if prefix else ""
        self._endpoint = endpoint
        self._secure = secure
        self._region = region
        self._retry_attempts = retry_attempts
        self._retry_base_delay_s = retry_base_delay_s
        self._retry_max_delay_s = retry_max_delay_s
        self._timeout_s = timeout_s
        self._part_size_bytes = part_size_bytes
        try:
            check_bucket_name(bucket, strict=True)
        except ValueError as e:
            raise InvalidStoreURLError(
                f"invalid bucket name {bucket!r} in {self.url}: {e}; bucket names are "
                "3-63 lowercase letters, digits, '.' and '-'") from None
        if prefix:
            _check_key(prefix)
        if retry_attempts < 1:
            raise ValueError(f"retry_attempts must be >= 1, got {retry_attempts}")
        if retry_base_delay_s < 0 or retry_max_delay_s < 0 or timeout_s <= 0:
            raise ValueError("retry delays must be >= 0 and timeout_s > 0")
        if part_size_bytes < _MIN_PART_SIZE_BYTES:
            raise ValueError(f"part_size_bytes must be >= {_MIN_PART_SIZE_BYTES} (S3's "
                             f"minimum part size), got {part_size_bytes}")
        if access_key is None or secret_key is None:
            access_key, secret_key = _env_credentials()
        if not access_key or not secret_key:
            raise StorageError(
                f"no S3 credentials for {self.url}: set BASTION_S3_ACCESS_KEY and "
                "BASTION_S3_SECRET_KEY (or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY)")
        self._access_key = _Secret(access_key)
        self._secret_key = _Secret(secret_key)
        self._init_runtime()

    def _init_runtime(self) -> None:
        self._client: Any = None
        self._http: Any = None
        self._client_lock = threading.Lock()
        self._rng = random.Random()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        for name in ("_client", "_http", "_client_lock", "_rng"):
            del state[name]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._init_runtime()

    @property
    def url(self) -> str:
        params = [f"endpoint={self._endpoint}", f"secure={'true' if self._secure else 'false'}"]
        for name, default in _S3_DEFAULTS.items():
            value = getattr(self, "_" + name)
            if value != default:
                params.append(f"{name}={value}")
        return f"s3://{self._bucket}/{self._prefix.rstrip('/')}?" + "&".join(params)

    @property
    def bucket(self) -> str:
        return self._bucket

    def _get_client(self) -> Any:
        with self._client_lock:
            if self._client is None:
                import certifi
                import urllib3
                from minio import Minio

                # Retries are ours (with backoff, logging and a clear final error),
                # so the HTTP layer must not retry underneath them.
                self._http = urllib3.PoolManager(
                    timeout=urllib3.Timeout(connect=self._timeout_s, read=self._timeout_s),
                    maxsize=16, retries=False,
                    cert_reqs="CERT_REQUIRED", ca_certs=certifi.where())
                self._client = Minio(
                    self._endpoint, access_key=self._access_key.value,
                    secret_key=self._secret_key.value, secure=self._secure,
                    region=self._region, http_client=self._http)
            return self._client

    def close(self) -> None:
        with self._client_lock:
            http, self._client, self._http = self._http, None, None
        if http is not None:
            http.clear()

    def _scrub(self, text: str) -> str:
        return scrub_secrets(text, (self._secret_key.value, self._access_key.value))

    def _retryable(self, exc: BaseException) -> bool:
        import urllib3
        from minio.error import InvalidResponseError, S3Error, ServerError

        if isinstance(exc, S3Error):
            status = exc.response.status if exc.response is not None else 0
            return exc.code in _RETRYABLE_S3_CODES or status >= 500
        if isinstance(exc, ServerError):
            return exc.status_code >= 500
        if isinstance(exc, InvalidResponseError):
            # Non-XML errors come from proxies and load balancers (502/503 pages).
            return (getattr(exc, "_code", 0) or 0) >= 500
        return isinstance(exc, (urllib3.exceptions.HTTPError, OSError))

    def _call(self, op: str, key: str | None, fn: Callable[[Any], _T]) -> _T:
        from minio.error import S3Error

        where = f"{op} {key!r}" if key is not None else op
        last: BaseException | None = None
        for attempt in range(1, self._retry_attempts + 1):
            try:
                return fn(self._get_client())
            except S3Error as e:
                if e.code == "NoSuchKey" and key is not None:
                    raise KeyNotFoundError(f"{self.url}: no object {key!r}", key) from None
                if not self._retryable(e):
                    raise StorageError(self._scrub(
                        f"{self.url}: {where} refused by the server: {e.code}: {e.message}"
                        + _S3_HINTS.get(e.code, ""))) from None
                last = e
            except Exception as e:
                if not self._retryable(e):
                    raise
                last = e
            if attempt < self._retry_attempts:
                delay = min(self._retry_max_delay_s,
                            self._retry_base_delay_s * 2 ** (attempt - 1))
                delay = self._rng.uniform(delay / 2, delay)
                _log.warning("%s: %s failed (attempt %d/%d): %s; retrying in %.2fs",
                             self.url, where, attempt, self._retry_attempts,
                             self._scrub(_describe(last)), delay)
                time.sleep(delay)
        assert last is not None
        raise StoreUnavailableError(
            self._scrub(f"{self.url} unavailable: {where} failed after "
                        f"{self._retry_attempts} attempts: {_describe(last)}; check that "
                        "the S3 endpoint is running and reachable"),
            url=self.url, operation=op, key=key, attempts=self._retry_attempts) from last

    def _name(self, key: str) -> str:
        _check_key(key)
        return self._prefix + key

    def ensure_bucket(self) -> None:
        """Check the endpoint answers and the credentials work; create the bucket if
        it does not exist yet."""
        from minio.error import S3Error

        def create(client: Any) -> None:
            if client.bucket_exists(self._bucket):
                return
            try:
                client.make_bucket(self._bucket)
            except S3Error as e:
                if e.code != "BucketAlreadyOwnedByYou":  # lost a benign creation race
                    raise

        self._call("open", None, create)

    def put(self, key: str, data: bytes | bytearray | memoryview) -> None:
        name = self._name(key)
        length = len(data)
        # A part size so small that the object needs > 10,000 parts is refused by S3.
        part_size = max(self._part_size_bytes, -(-length // _MAX_PARTS))

        def put(client: Any) -> None:
            client.put_object(self._bucket, name, io.BytesIO(data), length,
                              part_size=part_size)

        self._call("put", key, put)

    def get(self, key: str, offset: int = 0, length: int | None = None) -> bytes:
        _check_range(offset, length)
        name = self._name(key)
        if length == 0:
            self.size(key)  # still raise KeyNotFoundError for a missing key
            return b""
        from minio.error import S3Error

        def get(client: Any) -> bytes:
            try:
                resp = client.get_object(self._bucket, name, offset=offset,
                                         length=length or 0)
            except S3Error as e:
                if e.code == "InvalidRange":  # offset at or past the end
                    return b""
                raise
            try:
                return resp.read()
            finally:
                resp.close()
                resp.release_conn()

        return self._call("get", key, get)

    def _listing(self, prefix: str) -> list[Any]:
        _check_prefix(prefix)
        return self._call("list", prefix, lambda client: list(client.list_objects(
            self._bucket, prefix=self._prefix + prefix, recursive=True)))

    def list(self, prefix: str = "") -> list[str]:
        cut = len(self._prefix)
        return sorted(o.object_name[cut:] for o in self._listing(prefix))

    def list_sizes(self, prefix: str = "") -> dict[str, int]:
        cut = len(self._prefix)
        return {o.object_name[cut:]: o.size
                for o in sorted(self._listing(prefix), key=lambda o: o.object_name)}

    def list_modified(self, prefix: str = "") -> dict[str, float]:
        cut = len(self._prefix)
        return {o.object_name[cut:]: o.last_modified.timestamp()
                for o in sorted(self._listing(prefix), key=lambda o: o.object_name)}

    def delete(self, key: str) -> None:
        name = self._name(key)
        self._call("delete", key, lambda client: client.remove_object(self._bucket, name))

    def exists(self, key: str) -> bool:
        try:
            self.size(key)
        except KeyNotFoundError:
            return False
        return True

    def size(self, key: str) -> int:
        name = self._name(key)
        return self._call("size", key,
                          lambda client: client.stat_object(self._bucket, name).size)


_S3_HINTS: dict[str | None, str] = {  # by S3 error code (minio's may be None)
    "AccessDenied": "; check BASTION_S3_ACCESS_KEY/BASTION_S3_SECRET_KEY and the "
                    "bucket policy",
    "InvalidAccessKeyId": "; check BASTION_S3_ACCESS_KEY",
    "SignatureDoesNotMatch": "; check BASTION_S3_SECRET_KEY",
    "NoSuchBucket": "; the bucket was deleted after the store was opened",
}


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


# --------------------------------------------------------------------------- URLs


def scrub_secrets(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every whole occurrence of a secret hidden, character for
    character. Whole: not inside a longer run of letters and digits — a short test
    key ``x`` must not turn ``s3://bucket/prefix`` into ``s3://bucket/prefi***``."""
    for secret in sorted({s for s in secrets if s}, key=len, reverse=True):
        text = re.sub(rf"(?<![A-Za-z0-9]){re.escape(secret)}(?![A-Za-z0-9])",
                      "*" * len(secret), text)
    return text


def _redact(url: str) -> str:
    """The URL with any user-info (``user:password@``) masked."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    netloc, slash, tail = rest.partition("/")
    if "@" in netloc:
        netloc = "***@" + netloc.rpartition("@")[2]
    return f"{scheme}://{netloc}{slash}{tail}"


def _parse_bool(url: str, name: str, value: str) -> bool:
    lowered = value.lower()
    if lowered in ("true", "1", "yes", "on"):
        return True
    if lowered in ("false", "0", "no", "off"):
        return False
    raise InvalidStoreURLError(
        f"invalid {name}={value!r} in {url!r}: use {name}=true or {name}=false")


def _parse_number(url: str, name: str, value: str, kind: type) -> Any:
    try:
        return kind(value)
    except ValueError:
        raise InvalidStoreURLError(
            f"invalid {name}={value!r} in {url!r}: expected "
            f"{'an integer' if kind is int else 'a number'}") from None


def _query(url: str, query: str, allowed: tuple[str, ...]) -> dict[str, str]:
    try:
        parsed = parse_qs(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError:
        raise InvalidStoreURLError(f"malformed query string in {url!r}") from None
    params: dict[str, str] = {}
    for name, values in parsed.items():
        if name not in allowed:
            raise InvalidStoreURLError(
                f"unknown parameter {name!r} in {url!r}: allowed are "
                + ", ".join(allowed))
        if len(values) > 1:
            raise InvalidStoreURLError(f"parameter {name!r} given twice in {url!r}")
        params[name] = values[0]
    return params


_S3_PARAMS = ("endpoint", "secure", *_S3_DEFAULTS)


def open_store(url: str) -> ObjectStore:
    """Open the object store a URL names, checking it is usable.

    * ``local://PATH`` — a directory (relative paths resolve against the current
      directory; ``local:///abs/path`` for an absolute one). ``?fsync=true`` makes
      every put durable against power loss.
    * ``s3://BUCKET/PREFIX?endpoint=HOST:PORT`` — an S3 bucket; optional parameters
      ``secure`` (default true; ``false`` for plain HTTP), ``region``,
      ``retry_attempts``, ``retry_base_delay_s``, ``retry_max_delay_s``, ``timeout_s``,
      ``part_size_bytes``. Without ``endpoint``, ``BASTION_S3_ENDPOINT`` is used. The
      bucket is created if missing.

    Raises :class:`InvalidStoreURLError` for a malformed URL, and
    :class:`StoreUnavailableError` if the S3 endpoint does not answer; messages name
    the URL (never its credentials) and say what to change.
    """
    if not isinstance(url, str) or not url.strip():
        raise InvalidStoreURLError(f"empty storage URL: {_URL_HELP}")
    shown = _redact(url)
    if "://" not in url:
        raise InvalidStoreURLError(
            f"storage URL {shown!r} has no scheme: {_URL_HELP} "
            f"(for a directory: local://{shown})")
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme == "local":
        params = _query(shown, parts.query, ("fsync",))
        path = parts.netloc + parts.path
        if not path:
            raise InvalidStoreURLError(
                f"no directory in {shown!r}: use local://PATH, e.g. local://.bastion")
        fsync = _parse_bool(shown, "fsync", params.get("fsync", "false"))
        return LocalStore(path, fsync=fsync)
    if scheme == "s3":
        if "@" in parts.netloc:
            raise InvalidStoreURLError(
                f"credentials in the storage URL {shown!r}: remove them and set "
                "BASTION_S3_ACCESS_KEY and BASTION_S3_SECRET_KEY instead")
        bucket = parts.netloc
        if not bucket:
            raise InvalidStoreURLError(
                f"no bucket in {shown!r}: use s3://BUCKET/PREFIX?endpoint=HOST:PORT")
        params = _query(shown, parts.query, _S3_PARAMS)
        endpoint = params.pop("endpoint", None) or os.environ.get("BASTION_S3_ENDPOINT")
        if not endpoint:
            raise InvalidStoreURLError(
                f"no endpoint in {shown!r}: add ?endpoint=HOST:PORT (e.g. "
                "endpoint=127.0.0.1:9000&secure=false for a local MinIO) or set "
                "BASTION_S3_ENDPOINT")
        _check_endpoint(shown, endpoint)
        kwargs: dict[str, Any] = {}
        if "secure" in params:
            kwargs["secure"] = _parse_bool(shown, "secure", params.pop("secure"))
        if "region" in params:
            kwargs["region"] = params.pop("region")
        for name in ("retry_attempts", "part_size_bytes"):
            if name in params:
                kwargs[name] = _parse_number(shown, name, params.pop(name), int)
        for name in ("retry_base_delay_s", "retry_max_delay_s", "timeout_s"):
            if name in params:
                kwargs[name] = _parse_number(shown, name, params.pop(name), float)
        try:
            store = MinioStore(bucket, parts.path, endpoint=endpoint, **kwargs)
        except ValueError as e:
            if isinstance(e, StorageError):
                raise
            raise InvalidStoreURLError(f"invalid storage URL {shown!r}: {e}") from None
        store.ensure_bucket()
        return store
    raise InvalidStoreURLError(f"unknown scheme {parts.scheme!r} in {shown!r}: {_URL_HELP}")


def _check_endpoint(url: str, endpoint: str) -> None:
    if "://" in endpoint or "/" in endpoint:
        raise InvalidStoreURLError(
            f"invalid endpoint {endpoint!r} in {url!r}: give HOST:PORT without a scheme "
            "or path (add secure=false for plain HTTP)")
    host, _, port = endpoint.rpartition(":") if ":" in endpoint else (endpoint, "", "")
    if not host or (port and not (port.isdigit() and 0 < int(port) < 65536)):
        raise InvalidStoreURLError(
            f"invalid endpoint {endpoint!r} in {url!r}: expected HOST:PORT, "
            "e.g. endpoint=127.0.0.1:9000")
