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

from bastion import aggregations, sinks, sources, windows
from bastion.errors import BastionError, JobFailedError, TopologyError, UDFError
from bastion.drills import DrillReport, drill
from bastion.launcher import RunResult, run
from bastion.runtime import faults
from bastion.runtime.operators import DeadLetter
from bastion.runtime.records import Codec, stable_hash
from bastion.topology import KeyedStream, Stream, Topology

__all__ = [
    "BastionError", "Codec", "DeadLetter", "DrillReport", "JobFailedError", "KeyedStream", "RunResult",
    "Stream", "Topology", "TopologyError", "UDFError", "aggregations", "drill", "faults", "run", "sinks",
    "sources", "stable_hash", "windows",
]
__version__ = "0.1.0"
