"""Codecs: how values of types msgpack cannot carry travel between instances.

Records cross process boundaries as msgpack, which carries None, bool, int, float,
str, bytes, sequences and maps. A value of any other type needs a `Codec`, registered
on the topology with ``topology.register_codec(cls, code, encode, decode)``: it
travels as msgpack extension type ``code`` holding ``encode(value)`` and is rebuilt by
``decode``. Codecs belong to the topology (not to a global registry), so every worker
of a job decodes exactly what its senders encoded.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable


@dataclass(frozen=True)
class Codec:
    """How values of type ``cls`` travel: as msgpack extension type ``code`` holding
    ``encode(value)``, rebuilt by ``decode``. Made by ``Topology.register_codec``."""

    cls: type
    code: int
    encode: Callable[[Any], bytes]
    decode: Callable[[bytes], Any]


__all__ = ["Codec"]
