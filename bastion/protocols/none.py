"""The ``none`` protocol: no checkpoints, at-most-once.

Records are processed once if nothing fails; a failure loses whatever was in flight
and in operator state. Sinks commit at the end of the stream. It is the baseline every
other protocol's overhead is measured against.
"""

from __future__ import annotations

from bastion.protocols.base import Protocol


class NoProtocol(Protocol):
    """No checkpoints, at-most-once: ``bn.protocols.NoCheckpoints()``, or
    ``protocol="none"``. It has no knobs."""

    name = "none"
    exactly_once = False
    tolerates_copies = True
