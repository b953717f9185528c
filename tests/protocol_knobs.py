"""Test support: a protocol given by name or as an object, checkpointing at an interval.

Many tests run one scenario under several protocols, some of them deliberately broken
subclasses (a drill must say "violated" for those). `with_interval` takes either: a name
is built with `bn.protocols.named` and its knobs; an object — made by the test — gets a
copy with the knobs set; ``"none"`` takes no checkpoints and no knobs.
"""

from __future__ import annotations

import copy
from typing import Any

import bastion as bn
from bastion.protocols import Protocol, knobs as checks


def with_interval(protocol: str | Protocol, interval_s: float, **knobs: Any) -> Protocol:
    if isinstance(protocol, str):
        if protocol == "none":
            return bn.protocols.NoCheckpoints()
        return bn.protocols.named(protocol, interval_s=interval_s, **knobs)
    made = copy.copy(protocol)
    made.interval_s = checks.interval(interval_s)
    for name, value in knobs.items():
        if not hasattr(made, name):
            raise TypeError(f"{type(protocol).__name__} has no knob {name!r}")
        setattr(made, name, value)
    return made
