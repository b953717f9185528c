"""Fault-tolerance protocols, one module each, behind the interface in `base`."""

from __future__ import annotations

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


__all__ = ["CecPolicy", "Protocol", "TaskProtocol", "get_protocol"]
