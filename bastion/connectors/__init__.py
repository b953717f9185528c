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

A connector may import storage and the descriptions it serves; nothing of the DSL
imports a connector at module level.
"""
