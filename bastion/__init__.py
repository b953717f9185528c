"""Bastion: a fault-tolerant stream-processing runtime on Ray.

Build a `Topology` with the DSL, run it with `run`, and read `RunResult.outputs`::

    import bastion as bn

    topo = bn.Topology("wordcount")
    lines = topo.source("lines", bn.sources.Collection(["a b", "b c"]))
    words = lines.flat_map("split", str.split)
    counts = words.key_by(lambda w: w).reduce("count", lambda acc, w: acc + 1, initial=0)
    counts.sink("out", bn.sinks.Collect())
    result = bn.run(topo)
    result.outputs["out"]   # [("a", 1), ("b", 1), ("b", 2), ("c", 1)] in some order
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# Every name is imported on first use (PEP 562), not here: ``import bastion`` and
# building a topology must not start Ray, the runtime or storage clients — the DSL is
# a description, and a malformed topology fails before any of them is loaded.
# ``bn.run`` loads the launcher (and with it Ray) when a program first runs a job.
_SUBMODULES = ("aggregations", "faults", "sinks", "sources", "windows")
_EXPORTS = {
    "codecs": ("Codec",),
    "drills": ("DrillReport", "drill"),
    "errors": ("BastionError", "JobFailedError", "NoUsableCheckpointError", "SinkCommitError",
               "TopologyError", "UDFError"),
    "launcher": ("RunResult", "run"),
    "runtime.operators": ("DeadLetter",),
    "runtime.records": ("stable_hash",),
    "topology": ("KeyedStream", "Stream", "Topology"),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}

if TYPE_CHECKING:  # what a type checker and an IDE see; at run time __getattr__ loads
    from bastion import aggregations, faults, sinks, sources, windows
    from bastion.codecs import Codec
    from bastion.drills import DrillReport, drill
    from bastion.errors import (BastionError, JobFailedError, NoUsableCheckpointError,
                                SinkCommitError, TopologyError, UDFError)
    from bastion.launcher import RunResult, run
    from bastion.runtime.operators import DeadLetter
    from bastion.runtime.records import stable_hash
    from bastion.topology import KeyedStream, Stream, Topology


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f".{name}", __name__)  # sets the attribute too
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # the next lookup is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


__all__ = sorted(_SUBMODULES + tuple(_MODULE_OF))
__version__ = "0.1.0"
