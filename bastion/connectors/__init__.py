"""Connectors: the I/O behind the sources and sinks a topology describes.

``bn.sources`` and ``bn.sinks`` are descriptions, part of the DSL: ``bn.sinks.Log(url)``
holds a URL, ``bn.sinks.File(path)`` a path, and building them imports nothing of
storage — a topology is cheap to build and a malformed one fails before anything is
loaded. The code that opens stores and files lives here, one module per kind of
endpoint, and a description's ``prepare``/``open`` imports its connector when a job
runs (in the driver for ``prepare``, in each worker for ``open``):

- `files`: ``File``'s JSON-lines writer, each commit point appended exactly once;
- `logs`: ``Log``'s sink writer and source reader over segmented logs in an object
  store, and the layout they share.

A connector may import storage and the interfaces of `bastion.io_interfaces`
(`SinkWriter`, `SourceReader`, the `LogDescription` it reads): never the description
modules ``bastion.sinks`` and ``bastion.sources`` themselves, which import their
connectors when a job runs — the arrows point one way, from a description to its
connector to the interfaces (``tests/test_import_arrows.py``). Nothing of the DSL
imports a connector at module level.
"""
