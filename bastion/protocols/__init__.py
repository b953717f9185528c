"""Fault-tolerance protocols, one module each, behind the interface in `base`.

A run names its protocol by an object that carries the protocol's own knobs —
``bn.run(topo, bn.protocols.Coordinated(interval_s=0.5))`` — or by its name, which is
shorthand for the defaults (``protocol="coordinated"``). The objects: `NoCheckpoints`
(``"none"``), `Acks` (``"acks"``), `Coordinated` (``"coordinated"``),
`Uncoordinated` (``"uncoordinated"``), `Cic` (``"cic"``) and `Cec` (``"cec"``).
Every protocol that checkpoints or commits takes ``interval_s`` (seconds); each
checks its knobs when it is made. The options of the run itself (data plane,
recovery, redundancy, limits, storage) are in `bastion.options`.
"""

from __future__ import annotations

from typing import Any

from bastion.protocols.acks import AcksProtocol
from bastion.protocols.base import Protocol, TaskProtocol
from bastion.protocols.cec import CecPolicy, CecProtocol
from bastion.protocols.cic import CicProtocol
from bastion.protocols.coordinated import CoordinatedProtocol
from bastion.protocols.none import NoProtocol
from bastion.protocols.uncoordinated import UncoordinatedProtocol

_PROTOCOLS: dict[str, type[Protocol]] = {"none": NoProtocol,
                                         "acks": AcksProtocol,
                                         "coordinated": CoordinatedProtocol,
                                         "uncoordinated": UncoordinatedProtocol,
                                         "cic": CicProtocol,
                                         "cec": CecProtocol}
#: ``protocol="none"``: no checkpoints, at-most-once (no knobs).
NoCheckpoints = NoProtocol
#: ``protocol="acks"``: tuple acknowledgments, at-least-once for stateless topologies;
#: ``Acks(mode="fine", timeout_s=5.0, max_pending=100_000, interval_s=1.0)``.
Acks = AcksProtocol
#: ``protocol="coordinated"``: aligned-barrier checkpoints, exactly-once;
#: ``Coordinated(interval_s=1.0, retained_checkpoints=2, timeout_s=None)``, where
#: ``interval_s`` may be a `bastion.options.AutoInterval`.
Coordinated = CoordinatedProtocol
#: ``protocol="uncoordinated"``: independent checkpoints and logged frames,
#: exactly-once; ``Uncoordinated(interval_s=1.0, retained_checkpoints=2)``.
Uncoordinated = UncoordinatedProtocol
#: ``protocol="cic"``: communication-induced checkpoints (HMNR), exactly-once;
#: ``Cic(interval_s=1.0, retained_checkpoints=2)``.
Cic = CicProtocol
#: ``protocol="cec"``: causal logging with eventual checkpoints, exactly-once;
#: ``Cec(policy=CecPolicy(), interval_s=1.0)`` (``interval_s``: how often sinks commit).
Cec = CecProtocol

KNOWN = ("none", "acks", "coordinated", "uncoordinated", "cic", "cec")


def get_protocol(name: str | Protocol) -> Protocol:
    """The protocol called ``name`` (or ``name`` itself if it already is one)."""
    if isinstance(name, Protocol):
        return name
    cls = _PROTOCOLS.get(name)
    if cls is None:
        if name in KNOWN:
            raise NotImplementedError(
                f"protocol {name!r} is not available in this version of Bastion; "
                f"available: {sorted(_PROTOCOLS)}")
        raise ValueError(f"unknown protocol {name!r}; choose one of {list(KNOWN)}")
    return cls()


def named(name: str, **knobs: Any) -> Protocol:
    """The protocol called ``name`` with ``knobs`` set — ``named("coordinated",
    interval_s=0.5)`` is ``Coordinated(interval_s=0.5)`` — for code that holds a
    protocol's name (a configuration file, a parametrized test, the command line). A
    knob the protocol does not have is a `TypeError` naming the protocol."""
    cls = _PROTOCOLS.get(name) if isinstance(name, str) else None
    if cls is None:
        get_protocol(name)   # raises, naming what is known
        raise TypeError(f"named() takes a protocol's name, got {name!r}: give the "
                        "knobs to the protocol object itself")
    try:
        return cls(**knobs)
    except TypeError as exc:
        raise TypeError(f"protocol {name!r} has no such knob: {exc}") from None


def default_of(protocol: Protocol) -> bool:
    """Is ``protocol`` one of the protocol objects above (not a subclass of one): its
    name then says all a report needs, as it does for the shorthand string."""
    return type(protocol) is _PROTOCOLS.get(protocol.name)


__all__ = ["Acks", "Cec", "CecPolicy", "Cic", "Coordinated", "NoCheckpoints", "Protocol",
           "TaskProtocol", "Uncoordinated", "get_protocol", "named"]
