"""Errors raised by Bastion's storage layer.

Every error derives from :class:`StorageError`, so a caller that only wants to know
"did storage fail?" catches one type. The subclasses say *how* it failed, because the
right reaction differs:

* :class:`InvalidStoreURLError` — the configuration is wrong; retrying cannot help.
* :class:`KeyNotFoundError` — the object does not exist (also a ``KeyError``).
* :class:`StoreUnavailableError` — the store could not be reached even after retries
  with backoff; the caller may keep running and try again later, but must not report
  anything durable that depended on the failed call.
* :class:`CorruptRecordError` / :class:`CorruptBlobError` — bytes were stored but are
  not what was written (CRC mismatch, impossible length). Corrupt bytes are never
  returned as data.
* :class:`IncompleteCheckpointError` — a checkpoint cannot be committed or loaded
  because a blob it needs is missing or has the wrong size.

Messages never contain credentials: stores render themselves by their public URL.

:class:`BastionError`, the root of every error Bastion raises on purpose, is defined
here rather than in ``bastion.errors``: storage is the bottom layer and imports nothing
else of Bastion, yet a storage failure is one of Bastion's errors (a caller that
catches ``bn.BastionError`` — the command line, a user's script — must see a bad
bucket or an unreachable endpoint too). ``bastion.errors`` re-exports it, so both names
are one class.
"""

from __future__ import annotations


class BastionError(Exception):
    """Base class of every error Bastion raises on purpose (``bn.BastionError``)."""


class StorageError(BastionError):
    """Base class of every storage failure."""

    # A worker finds a damaged or missing blob and the job master judges it: the error
    # crosses processes pickled. Exception's default pickling calls the class with its
    # message only, which the keyword fields of the subclasses (``key``, ``offset``...)
    # make fail (Ray then hands over an UnserializableException and the key is lost).
    def __reduce__(self) -> tuple:
        return _rebuild, (type(self), self.args, dict(self.__dict__))


def _rebuild(cls: type[StorageError], args: tuple, fields: dict) -> StorageError:
    error = cls.__new__(cls, *args)
    error.args = args
    error.__dict__.update(fields)
    return error


class InvalidStoreURLError(StorageError, ValueError):
    """A storage URL is malformed, names an unknown scheme, or has a bad parameter."""


class KeyNotFoundError(StorageError, KeyError):
    """The object does not exist in the store."""

    def __init__(self, message: str, key: str) -> None:
        super().__init__(message)
        self.key = key

    # KeyError.__str__ would wrap the message in quotes; keep it readable.
    def __str__(self) -> str:
        return str(self.args[0])


class StoreUnavailableError(StorageError):
    """The store did not answer (connection errors, 5xx) after every retry."""

    def __init__(self, message: str, *, url: str, operation: str, key: str | None,
                 attempts: int) -> None:
        super().__init__(message)
        self.url = url
        self.operation = operation
        self.key = key
        self.attempts = attempts


class CorruptRecordError(StorageError):
    """A log record failed its integrity check (bad CRC or impossible length)."""

    def __init__(self, message: str, *, key: str, offset: int) -> None:
        super().__init__(message)
        self.key = key
        self.offset = offset


class CorruptBlobError(StorageError):
    """A checkpoint blob's bytes do not match the size or CRC32 in its manifest."""

    def __init__(self, message: str, *, key: str) -> None:
        super().__init__(message)
        self.key = key


class IncompleteCheckpointError(StorageError):
    """A checkpoint names a blob that is missing or has the wrong size."""
