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

A run's protocol is an object with its own knobs, or its name for the defaults
(``bn.run(topo, bn.protocols.Coordinated(interval_s=0.5))``); its other settings are
one options object per concern (``data_plane=bn.DataPlane(...)``,
``recovery=bn.Recovery(...)``, ``redundancy=bn.Redundancy(...)``,
``limits=bn.Limits(...)``, ``storage=bn.Storage(...)``, ``state=bn.State(...)``:
`bastion.options`).

**Public and internal.** The public API is exactly what the ``__all__`` of the public
modules lists: this package's (the names above, as ``bn.NAME``) and those of
``bastion.topology``, ``sources``, ``sinks``, ``windows``, ``aggregations``, ``codecs``,
``errors``, ``faults``, ``options``, ``launcher``, ``drills``, ``report``, ``tuning``,
``lineage``, ``protocols`` and ``storage`` (the list is ``bastion._apidoc.PUBLIC_MODULES``;
docs/api.md shows every name, generated from the docstrings). A public name keeps its
meaning from one release to the next, or changes with a note in the changelog.

Everything else is internal: the modules ``bastion.runtime``, ``bastion.scheduler``,
``bastion.connectors``, ``bastion.spark_jobs``, ``bastion.bench``,
``bastion.io_interfaces`` and ``bastion.cli``, the protocol implementations under
``bastion.protocols``, every name a public module leaves out of its ``__all__``, and
every name that starts with ``_``. Internal means it may change or disappear without
notice; a test that uses an internal name carries the ``internal`` pytest marker.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bastion.storage.lazy import lazy_exports

# Every name is imported on first use (PEP 562), not here: ``import bastion`` and
# building a topology must not start Ray, the runtime or storage clients — the DSL is
# a description, and a malformed topology fails before any of them is loaded.
# ``bn.run`` loads the launcher (and with it Ray) when a program first runs a job.
_SUBMODULES = ("aggregations", "faults", "protocols", "sinks", "sources", "windows")
_EXPORTS = {
    "codecs": ("Codec",),
    "drills": ("DrillReport", "drill"),
    "errors": ("BastionError", "JobFailedError", "NoUsableCheckpointError", "SinkCommitError",
               "TopologyError", "UDFError", "UnstorableValueError"),
    "launcher": ("RunHandle", "RunResult", "run", "start", "stop"),
    "options": ("AutoInterval", "DataPlane", "Limits", "Recovery", "Redundancy", "State",
                "Storage"),
    "protocols.cec": ("CecPolicy",),
    "runtime.operators": ("DeadLetter",),
    "runtime.key_groups": ("instance_of",),
    "runtime.records": ("stable_hash",),
    "scheduler.recovery": ("RecoveryPolicy",),
    "scheduler.resiliency": ("ResiliencyPolicy",),
    "topology": ("KeyedStream", "Stream", "Topology"),
    "tuning": ("TuningResult", "tune"),
}

if TYPE_CHECKING:  # what a type checker and an IDE see; at run time __getattr__ loads
    from bastion import aggregations, faults, protocols, sinks, sources, windows
    from bastion.codecs import Codec
    from bastion.drills import DrillReport, drill
    from bastion.errors import (BastionError, JobFailedError, NoUsableCheckpointError,
                                SinkCommitError, TopologyError, UDFError,
                                UnstorableValueError)
    from bastion.launcher import RunHandle, RunResult, run, start, stop
    from bastion.options import (AutoInterval, DataPlane, Limits, Recovery, Redundancy,
                                 State, Storage)
    from bastion.protocols.cec import CecPolicy
    from bastion.runtime.operators import DeadLetter
    from bastion.runtime.key_groups import instance_of
    from bastion.runtime.records import stable_hash
    from bastion.scheduler.recovery import RecoveryPolicy
    from bastion.scheduler.resiliency import ResiliencyPolicy
    from bastion.topology import KeyedStream, Stream, Topology
    from bastion.tuning import TuningResult, tune


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, _SUBMODULES)

__all__ = sorted(_SUBMODULES + tuple(name for names in _EXPORTS.values() for name in names))
__version__ = "0.1.0"
