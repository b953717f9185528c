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

The package depends on nothing else in Bastion.
"""

from .checkpoints import BlobRef, CheckpointStore, GcReport, Manifest
from .errors import (
    CorruptBlobError,
    CorruptRecordError,
    IncompleteCheckpointError,
    InvalidStoreURLError,
    KeyNotFoundError,
    StorageError,
    StoreUnavailableError,
)
from .log import (
    LogReader,
    LogRecord,
    LogWriter,
    RecoveryInfo,
    SegmentInfo,
    TornTailReport,
    recover_log,
)
from .store import LocalStore, MinioStore, ObjectStore, open_store

__all__ = [
    "ObjectStore", "LocalStore", "MinioStore", "open_store",
    "LogWriter", "LogReader", "LogRecord", "SegmentInfo", "TornTailReport",
    "RecoveryInfo", "recover_log",
    "CheckpointStore", "BlobRef", "Manifest", "GcReport",
    "StorageError", "InvalidStoreURLError", "KeyNotFoundError", "StoreUnavailableError",
    "CorruptRecordError", "CorruptBlobError", "IncompleteCheckpointError",
]
