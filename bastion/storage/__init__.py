"""Bastion's storage layer: where durable bytes live and how they are laid out.

Three layers, each built only on the one below:

* :mod:`~bastion.storage.store` — :class:`ObjectStore`, a key → immutable-bytes map
  with atomic puts, on a local directory (:class:`LocalStore`, ``local://PATH``) or an
  S3 service such as MinIO (:class:`MinioStore`, ``s3://BUCKET/PREFIX?endpoint=...``);
  :func:`open_store` turns a URL into one.
* :mod:`~bastion.storage.log` — a segmented append-only log of ``(seq, ts, value)``
  records with a CRC per record, an index of segments, forward reads from a seq or
  an event time, backward reads, and torn-tail recovery.
* :mod:`~bastion.storage.checkpoints` — state blobs plus a manifest written last; a
  checkpoint is complete only when its manifest and every blob it names check out.

Beside them, :mod:`~bastion.storage.retention` decides which job folders a store
keeps (`prune_jobs`), and :mod:`~bastion.storage.errors` holds the errors — and
``BastionError``, the root of every error Bastion raises, because this bottom layer
may import nothing above it.

The package depends on nothing else in Bastion.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .lazy import lazy_exports

# Names are imported on first use (PEP 562), not here: `bastion.errors` imports
# `bastion.storage.errors` for the root error class, and that must not pull the S3
# client and the log code into every program that only builds a topology.
_EXPORTS = {
    "checkpoints": ("BlobRef", "CheckpointStore", "GcReport", "Manifest"),
    "errors": ("BastionError", "CorruptBlobError", "CorruptRecordError",
               "IncompleteCheckpointError", "InvalidStoreURLError", "KeyNotFoundError",
               "StorageError", "StoreUnavailableError"),
    "log": ("LogReader", "LogRecord", "LogWriter", "RecoveryInfo", "SegmentInfo",
            "TornTailReport", "recover_log"),
    "store": ("LocalStore", "MinioStore", "ObjectStore", "open_store"),
    "retention": ("JobFolder", "PruneReport", "delete_job", "list_jobs", "prune_jobs"),
}

if TYPE_CHECKING:  # what a type checker and an IDE see; at run time __getattr__ loads
    from .checkpoints import BlobRef, CheckpointStore, GcReport, Manifest
    from .errors import (BastionError, CorruptBlobError, CorruptRecordError,
                         IncompleteCheckpointError, InvalidStoreURLError, KeyNotFoundError,
                         StorageError, StoreUnavailableError)
    from .log import (LogReader, LogRecord, LogWriter, RecoveryInfo, SegmentInfo,
                      TornTailReport, recover_log)
    from .retention import JobFolder, PruneReport, delete_job, list_jobs, prune_jobs
    from .store import LocalStore, MinioStore, ObjectStore, open_store


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

__all__ = sorted(name for names in _EXPORTS.values() for name in names)
