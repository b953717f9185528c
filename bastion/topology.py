"""The topology DSL: a dataflow described as named operators joined by streams.

A `Topology` is a directed graph. Each node is a named *operator* (a source, a map, a
keyed reduce, a window, a join, a sink …) with a *parallelism* — how many instances of
it run side by side. Each edge says how records travel between the instances of two
operators (its *partitioning*):

- forward: instance ``i`` sends to instance ``i`` (the default between operators of
  equal parallelism, and what lets the runtime *chain* them into one process);
- rebalance: round-robin over the downstream instances (the default when parallelism
  differs);
- hash: by a stable hash of the record's key, so a key always meets the same instance
  and that instance's state (every keyed operation);
- broadcast: every record to every downstream instance.

``stream.key_by(fn)`` does not create an operator; it says that the next operator is
keyed by ``fn(value)``. Building the graph validates what it can at once (unique
names, parallelism ≥ 1, window sizes, a join of keyed streams); `Topology.validate`
checks the rest (every operator reaches a sink, every cycle is a declared feedback
edge) and runs before anything is deployed. Errors are `TopologyError`s naming the
operator.

Cycles are allowed only through ``topo.feedback(from_op, to_op)``: a declared back edge,
which only protocols that can checkpoint cyclic graphs accept.

**Names are store keys.** The topology's name starts its job id
(``jobs/<topology>-<8 hex digits>/``), and operator and sink names are folders in the
store (``checkpoints/<id>/<operator>/``, ``outputs/<sink>/``, ``logs/<operator>/``),
beside keys the layout itself uses. So every name — topology, operator, sink, query —
follows one rule (`check_name`): ASCII letters, digits, ``_``, ``-`` and ``.``, at most
`MAX_NAME_LENGTH` characters, not ``.`` or ``..``, and none of `RESERVED_NAMES` in any
case (a sink named ``COMMITTED`` would land among the commit markers). A local store
on a case-insensitive file system (macOS, Windows) keeps ``Out`` and ``out`` in one
folder, so two operator names that differ only in case are refused too. Names are
checked as the graph is built and again by `Topology.validate`, before anything is
deployed.

**Typed streams.** To a type checker (mypy, pyright) and an editor, a stream carries
records of one type, and each operator says what it makes of them: a ``Source[T]`` (a
``Collection`` of ``T`` items, a ``Generator`` whose ``fn`` returns ``T``; a ``Log`` is
``Source[Any]``) gives a ``Stream[T]``; ``map(fn: T -> U)`` a ``Stream[U]``;
``key_by(fn: T -> K)`` a ``KeyedStream[K, T]``, whose ``reduce(fn: (A, T) -> A,
initial: A)`` is a ``Stream[tuple[K, A]]`` (the ``(key, acc)`` pairs it emits),
``stateful_map(fn: (S, T) -> (S, U), initial: S)`` a ``Stream[U]``, ``join`` with a
``KeyedStream[K, W]`` a ``Stream[tuple[K, T, W]]``, and ``window(spec).aggregate`` of
an ``Aggregation[T, A, R]`` a ``Stream[tuple[K, float, float, R]]``. So a reduce fed
``str`` records whose function adds them to an ``int`` is an error before the job
runs. A stream's record type is covariant (a ``Stream[bool]`` is a ``Stream[int]``;
``union`` of a ``Stream[A]`` with ``Stream[B]`` streams is a ``Stream[A | B]``); a
key's is invariant, since a join pairs keys of one type. The types exist for the
checker only: at run time every stream is the same plain object, no record's type is
checked, and a topology pickles (for Ray actors) as before.
``tests/test_typed_dsl.py`` runs ``mypy --strict`` over these DSL modules and
``examples/``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable, Generic, Iterable, TypeVar, overload

from bastion import _batches
from bastion import aggregations as _aggregations
from bastion import windows as _windows
from bastion.errors import TopologyError
from bastion.codecs import Codec
from bastion.sinks import Sink
from bastion.sources import Source

FORWARD = "forward"
REBALANCE = "rebalance"
HASH = "hash"
BROADCAST = "broadcast"
AUTO = "auto"  # forward when parallelism matches, rebalance otherwise

# Type variables of the typed DSL (see the module docstring). A stream only produces
# its records, so its record type is covariant: a Stream[bool] is a Stream[int]. A key
# is invariant: a join pairs keys of one type.
T = TypeVar("T")  # a source's records
T_co = TypeVar("T_co", covariant=True)  # a stream's records
V_co = TypeVar("V_co", covariant=True)  # a keyed stream's records (its values)
K = TypeVar("K")  # a key
U = TypeVar("U")  # what a function makes of a record
W = TypeVar("W")  # the other side of a join
A = TypeVar("A")  # a reduce's accumulator
S = TypeVar("S")  # a stateful_map's state
R = TypeVar("R")  # a window aggregation's result

# reduce's ``initial`` when not given: an aggregation brings its own (its create())
_NO_INITIAL: Any = object()


def _makes_aggregations(obj: Any) -> bool:
    """Is ``obj`` a class whose instances are aggregations (it has the four methods)?
    reduce, like `WindowedStream.aggregate`, accepts a class and makes one."""
    return isinstance(obj, type) and all(
        callable(getattr(obj, m, None)) for m in ("create", "add", "merge", "result"))


OPERATOR_KINDS = (
    "source", "map", "filter", "flat_map", "reduce", "stateful_map", "window", "join",
    "union", "sink",
)


@dataclass
class Input:
    """One incoming edge of an operator."""

    upstream: str
    partition: str = AUTO
    key_fn: Callable[[Any], Any] | None = None
    feedback: bool = False


@dataclass
class OpNode:
    """A logical operator: what it does (``kind`` and ``params``) and where it reads."""

    name: str
    kind: str
    parallelism: int
    inputs: list[Input] = field(default_factory=list)
    params: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Query:
    """A named set of sinks with a priority (used by progressive recovery)."""

    name: str
    outputs: tuple[str, ...]
    priority: float


# The rule for names (see the module docstring). ASCII only: file systems fold case
# and normalise Unicode in ways that could make two different names one folder.
_NAME = re.compile(r"[A-Za-z0-9_.-]+")
MAX_NAME_LENGTH = 100
# Fixed key segments of the store layout that sit beside names, and what they are
# (`bastion.runtime.outputs`, `bastion.storage.checkpoints`). Refused in any case: a
# local store on a case-insensitive file system maps ``committed`` onto ``COMMITTED``.
RESERVED_NAMES = {
    "COMMITTED": "jobs/<job>/outputs/COMMITTED/ holds the commit markers, beside each "
                 "sink's outputs/<sink>/",
    "MANIFEST": "jobs/<job>/checkpoints/<id>/MANIFEST is a checkpoint's manifest, beside "
                "each operator's checkpoints/<id>/<operator>/",
    "channels": "jobs/<job>/checkpoints/<id>/channels/ holds channel state, beside each "
                "operator's checkpoints/<id>/<operator>/",
}
_RESERVED = {name.lower(): name for name in RESERVED_NAMES}
_NAME_RULE = (f"Names become keys in the store, so a name holds only ASCII letters, "
              f"digits, '_', '-' and '.' (at most {MAX_NAME_LENGTH}), is not '.' or '..', "
              f"and is none of {', '.join(RESERVED_NAMES)} in any case; rename it")


def check_name(what: str, name: Any) -> str:
    """``name`` if it may name ``what`` (e.g. ``"sink"``, ``"topology"``); else a
    `TopologyError` naming it, what is wrong with it, and the rule."""
    if not isinstance(name, str) or not name:
        problem = "it is empty" if name == "" else f"it is a {type(name).__name__}, not a str"
    elif name in (".", ".."):
        problem = f"{name!r} means a folder of the store, not a name"
    elif not _NAME.fullmatch(name):
        bad = sorted({c for c in name if not _NAME.fullmatch(c)})
        problem = f"it contains {', '.join(map(repr, bad))}"
    elif len(name) > MAX_NAME_LENGTH:
        problem = f"it is {len(name)} characters long"
    elif name.lower() in _RESERVED:
        reserved = _RESERVED[name.lower()]
        problem = f"{reserved!r} is reserved (in any case): {RESERVED_NAMES[reserved]}"
    else:
        return name
    raise TopologyError(f"{what} name {name!r}: {problem}. {_NAME_RULE}")


def _check_callable(op: str, what: str, fn: Any) -> None:
    if not callable(fn):
        raise TopologyError(f"operator {op!r}: {what} must be callable, got {fn!r}")


class Topology:
    """A named dataflow graph. Build it with `source` and the `Stream` methods."""

    def __init__(self, name: str):
        self.name = check_name("topology", name)
        self.nodes: dict[str, OpNode] = {}
        self.queries: dict[str, Query] = {}
        self.codecs: list[Codec] = []

    def register_codec(self, cls: type, code: int, encode: Callable[[Any], bytes],
                       decode: Callable[[bytes], Any]) -> None:
        """Let values of type ``cls`` travel between instances, and be stored in state
        and sink outputs, as msgpack ext type ``code`` (0–111), encoded by ``encode``
        and rebuilt by ``decode``."""
        # 112..127 are Bastion's own codes for stored state (tuple, set, big int...:
        # `bastion.runtime.durable.RESERVED_CODES`); a user codec there would be
        # decoded as one of them. The DSL imports nothing of the runtime, hence the
        # number; a test checks that both agree.
        if not 0 <= code <= 111:
            raise TopologyError(f"codec for {cls.__name__}: ext code must be 0..111 "
                                f"(112..127 are reserved for Bastion), got {code}")
        for codec in self.codecs:
            if codec.code == code or codec.cls is cls:
                raise TopologyError(f"codec for {cls.__name__}: code {code} or type already "
                                    f"registered (for {codec.cls.__name__})")
        self.codecs.append(Codec(cls, code, encode, decode))

    # -- building -------------------------------------------------------------------

    def _add(self, name: str, kind: str, parallelism: int | None, inputs: list[Input],
             **params: Any) -> OpNode:
        check_name("sink" if kind == "sink" else f"{kind} operator", name)
        if name in self.nodes:
            raise TopologyError(
                f"operator name {name!r} is used twice (a {self.nodes[name].kind} and a "
                f"{kind}); names must be unique in topology {self.name!r}"
            )
        self._check_case(name, kind)
        if parallelism is None:
            parallelism = max((self.nodes[i.upstream].parallelism for i in inputs), default=1)
        if not isinstance(parallelism, int) or isinstance(parallelism, bool) or parallelism < 1:
            raise TopologyError(
                f"operator {name!r}: parallelism must be an int >= 1, got {parallelism!r}"
            )
        node = OpNode(name, kind, parallelism, inputs, dict(params))
        self.nodes[name] = node
        return node

    def source(self, name: str, source: Source[T], *, parallelism: int = 1,
               timestamp: Callable[[T], float] | None = None,
               max_out_of_orderness: float = 0.0) -> Stream[T]:
        """Add a source. ``timestamp(value)`` gives event time in seconds (without it, the
        ingest time: when the record first arrived, `bastion.sources`); watermarks trail the largest timestamp by
        ``max_out_of_orderness`` seconds, and a record behind its source's watermark is
        late: it goes to the dead-letter output with reason ``"late"``."""
        if not isinstance(source, Source):
            raise TopologyError(
                f"source {name!r}: expected a bastion source (e.g. bn.sources.Collection), "
                f"got {type(source).__name__}"
            )
        if timestamp is not None:
            _check_callable(name, "timestamp", timestamp)
        if max_out_of_orderness < 0:
            raise TopologyError(
                f"source {name!r}: max_out_of_orderness must be >= 0 seconds, "
                f"got {max_out_of_orderness}"
            )
        self._add(name, "source", parallelism, [], source=source, timestamp=timestamp,
                  max_out_of_orderness=float(max_out_of_orderness))
        return Stream(self, name)

    def query(self, name: str, outputs: Iterable[str], priority: float = 1) -> None:
        """Name a set of sinks as a query; recovery can restore queries by priority."""
        outputs = tuple(outputs)
        check_name("query", name)
        if name in self.queries:
            raise TopologyError(f"query name {name!r} is used twice")
        if not outputs:
            raise TopologyError(f"query {name!r} names no outputs")
        self.queries[name] = Query(name, outputs, priority)

    def feedback(self, from_op: str | Stream[Any], to_op: str, *,
                 key: Callable[[Any], Any] | None = None) -> None:
        """Declare a back edge ``from_op → to_op`` that closes a cycle (e.g. an iteration).
        With ``key`` the edge is hash-partitioned by ``key(value)``."""
        self._edge(from_op, to_op, key, feedback=True)

    def connect(self, from_op: str | Stream[Any], to_op: str, *,
                key: Callable[[Any], Any] | None = None) -> None:
        """Add a plain edge between two existing operators (for graphs built from
        configuration). An edge that closes a cycle must be a `feedback` edge instead."""
        self._edge(from_op, to_op, key, feedback=False)

    def _edge(self, from_op: str | Stream[Any], to_op: str, key: Callable[[Any], Any] | None,
              feedback: bool) -> None:
        src = from_op.name if isinstance(from_op, Stream) else from_op
        what = "feedback edge" if feedback else "edge"
        for end in (src, to_op):
            if end not in self.nodes:
                raise TopologyError(f"{what} {src!r} -> {to_op!r}: no operator named {end!r}")
        dst = self.nodes[to_op]
        if dst.kind == "source":
            raise TopologyError(f"{what} {src!r} -> {to_op!r}: operator {to_op!r} is a source "
                                "and cannot have inputs")
        if self.nodes[src].kind == "sink":
            raise TopologyError(f"{what} {src!r} -> {to_op!r}: operator {src!r} is a sink "
                                "and has no output")
        if key is not None:
            _check_callable(to_op, "key", key)
        dst.inputs.append(Input(src, HASH if key else AUTO, key, feedback=feedback))

    def _check_case(self, name: str, kind: str, others: Iterable[str] | None = None) -> None:
        """Refuse operator ``name`` if another operator's name differs from it only in
        case: a case-insensitive store would keep both in one folder."""
        for other in self.nodes if others is None else others:
            if other != name and other.lower() == name.lower():
                raise TopologyError(
                    f"operator names {other!r} and {name!r} (a {kind}) differ only in "
                    "case: a store on a case-insensitive file system (macOS, Windows) "
                    "would keep their checkpoints and outputs in one folder; rename one")

    def _check_names(self) -> None:
        """Every name against the rule (`check_name`), again: a name may have been
        changed since it was added (``topo.name = ...``)."""
        check_name("topology", self.name)
        for key, node in self.nodes.items():
            what = "sink" if node.kind == "sink" else f"{node.kind} operator"
            check_name(what, node.name)
            if key != node.name:
                raise TopologyError(f"{what} {node.name!r} is registered as {key!r}; "
                                    "rename operators when adding them, not afterwards")
        seen: list[str] = []
        for name, node in self.nodes.items():
            self._check_case(name, node.kind, seen)
            seen.append(name)
        for name in self.queries:
            check_name("query", name)

    # -- validation -----------------------------------------------------------------

    def validate(self) -> None:
        """Check the whole graph; raise `TopologyError` naming the first bad operator."""
        self._check_names()
        if not any(n.kind == "source" for n in self.nodes.values()):
            raise TopologyError(f"topology {self.name!r} has no source")
        sinks = [n.name for n in self.nodes.values() if n.kind == "sink"]
        if not sinks:
            raise TopologyError(f"topology {self.name!r} has no sink: add stream.sink(...)")
        for node in self.nodes.values():
            if node.kind != "source" and not node.inputs:
                raise TopologyError(f"operator {node.name!r} has no input")
        self._check_cycles()
        reaches_sink = set(sinks)
        changed = True
        while changed:
            changed = False
            for node in self.nodes.values():
                for inp in node.inputs:
                    if node.name in reaches_sink and inp.upstream not in reaches_sink:
                        reaches_sink.add(inp.upstream)
                        changed = True
        for node in self.nodes.values():
            if node.name not in reaches_sink:
                raise TopologyError(
                    f"operator {node.name!r} has no path to a sink: its output is never "
                    "consumed; add a .sink(...) downstream of it or remove it"
                )
        for query in self.queries.values():
            for out in query.outputs:
                if out not in self.nodes or self.nodes[out].kind != "sink":
                    raise TopologyError(f"query {query.name!r} names {out!r}, which is not a sink")

    def _check_cycles(self) -> None:
        downstream: dict[str, list[str]] = {name: [] for name in self.nodes}
        for node in self.nodes.values():
            for inp in node.inputs:
                if not inp.feedback:
                    downstream[inp.upstream].append(node.name)
        state: dict[str, int] = {}  # 1 = on the DFS stack, 2 = done

        def visit(name: str, path: list[str]) -> None:
            state[name] = 1
            for nxt in downstream[name]:
                if state.get(nxt) == 1:
                    cycle = path[path.index(nxt):] + [name, nxt] if nxt in path else [name, nxt]
                    raise TopologyError(
                        f"operator {nxt!r} is on a cycle ({' -> '.join(cycle)}) that is not "
                        "declared as feedback; close cycles with topo.feedback(from, to)"
                    )
                if nxt not in state:
                    visit(nxt, path + [name])
            state[name] = 2

        for name in self.nodes:
            if name not in state:
                visit(name, [])

    # -- introspection --------------------------------------------------------------

    def downstream_of(self, name: str) -> list[str]:
        return [n.name for n in self.nodes.values() if any(i.upstream == name for i in n.inputs)]

    def has_feedback(self) -> bool:
        return any(i.feedback for n in self.nodes.values() for i in n.inputs)

    def __repr__(self) -> str:
        return f"Topology({self.name!r}, operators={list(self.nodes)})"


class Stream(Generic[T_co]):
    """The output of an operator, carrying records of type ``T_co`` (to a type
    checker); its methods add operators downstream of it."""

    def __init__(self, topology: Topology, name: str, partition: str = AUTO):
        self.topology = topology
        self.name = name
        self._partition = partition

    def _input(self) -> Input:
        return Input(self.name, self._partition)

    def _unary(self, kind: str, name: str, fn: Callable[..., Any], parallelism: int | None,
               **params: Any) -> Stream[Any]:
        _check_callable(name, "fn", fn)
        self.topology._add(name, kind, parallelism, [self._input()], fn=fn, **params)
        return Stream(self.topology, name)

    def map(self, name: str, fn: Callable[[T_co], U], *, parallelism: int | None = None
            ) -> Stream[U]:
        """``fn(value)`` for every record."""
        return self._unary("map", name, fn, parallelism)

    def filter(self, name: str, fn: Callable[[T_co], object], *,
               parallelism: int | None = None) -> Stream[T_co]:
        """Keep the records for which ``fn(value)`` is true."""
        return self._unary("filter", name, fn, parallelism)

    def flat_map(self, name: str, fn: Callable[[T_co], Iterable[U]], *,
                 parallelism: int | None = None) -> Stream[U]:
        """Every element of ``fn(value)``, each a record with the input's timestamp."""
        return self._unary("flat_map", name, fn, parallelism)

    def map_batches(self, name: str, fn: Callable[[Any], Any], *,
                    format: _batches.BatchFormat = "numpy",
                    parallelism: int | None = None) -> Stream[Any]:
        """``fn(column)`` once per batch: ``column`` holds the batch's values as a
        numpy array (``format="numpy"``: ``numpy.asarray(values)``) or a pyarrow array
        (``format="arrow"``), and ``fn`` returns a column of the same length, whose
        items become the output records' values (a numpy or arrow result as Python
        values). ``fn`` must be elementwise (`bastion._batches` says why); a result of
        another length fails the job with a `UDFError` naming this operator; when
        ``fn`` raises, the values it fails on alone are dead-lettered."""
        _check_callable(name, "fn", fn)
        try:
            _batches.check_format(format)
        except ValueError as exc:
            raise TopologyError(f"map_batches {name!r}: {exc}") from None
        self.topology._add(name, "map", parallelism, [self._input()], fn=fn,
                           batch_format=format)
        return Stream(self.topology, name)

    def filter_batches(self, name: str, fn: Callable[[Any], Any], *,
                       format: _batches.BatchFormat = "numpy",
                       parallelism: int | None = None) -> Stream[T_co]:
        """`filter` with a batch function: ``fn(column)`` gives a column of as many
        truth values (see `map_batches`), and the records whose value is true go on."""
        _check_callable(name, "fn", fn)
        try:
            _batches.check_format(format)
        except ValueError as exc:
            raise TopologyError(f"filter_batches {name!r}: {exc}") from None
        self.topology._add(name, "filter", parallelism, [self._input()], fn=fn,
                           batch_format=format)
        return Stream(self.topology, name)

    def key_by_batch(self, fn: Callable[[Any], Any], *,
                     format: _batches.BatchFormat = "numpy") -> KeyedStream[Any, T_co]:
        """`key_by` with a batch function: ``fn(column)`` gives the keys of a whole
        batch's values as one column (see `map_batches`); numpy or arrow keys become
        Python values."""
        _check_callable(f"key_by_batch after {self.name}", "key", fn)
        try:
            _batches.check_format(format)
        except ValueError as exc:
            raise TopologyError(f"key_by_batch after {self.name!r}: {exc}") from None
        return KeyedStream(self.topology, self.name, _batches.BatchKey(fn, format))

    def key_by(self, fn: Callable[[T_co], K]) -> KeyedStream[K, T_co]:
        """Partition by ``fn(value)``: the next operator is keyed. Keys must be values
        msgpack can carry; they are routed by a stable hash."""
        _check_callable(f"key_by after {self.name}", "key", fn)
        return KeyedStream(self.topology, self.name, fn)

    def rebalance(self) -> Stream[T_co]:
        """Send the next edge round-robin over the downstream instances."""
        return Stream(self.topology, self.name, REBALANCE)

    def broadcast(self) -> Stream[T_co]:
        """Send every record on the next edge to every downstream instance."""
        return Stream(self.topology, self.name, BROADCAST)

    def union(self, *others: Stream[U], name: str, parallelism: int | None = None
              ) -> Stream[T_co | U]:
        """All records of this stream and of ``others``, interleaved. (Typed: a
        ``Stream[A]`` with ``Stream[B]``s is a ``Stream[A | B]``.)"""
        for other in others:
            if not isinstance(other, Stream) or other.topology is not self.topology:
                raise TopologyError(f"union {name!r}: every input must be a stream of the "
                                    "same topology")
        inputs = [self._input()] + [o._input() for o in others]
        self.topology._add(name, "union", parallelism, inputs)
        return Stream(self.topology, name)

    def sink(self, name: str, sink: Sink, *, parallelism: int | None = None) -> None:
        """Write the stream to ``sink``; outputs are committed exactly once."""
        if not isinstance(sink, Sink):
            raise TopologyError(f"sink {name!r}: expected a bastion sink (e.g. "
                                f"bn.sinks.Collect()), got {type(sink).__name__}")
        self.topology._add(name, "sink", parallelism, [self._input()], sink=sink)


class KeyedStream(Stream[V_co], Generic[K, V_co]):
    """A stream of ``V_co`` records whose next operator is keyed by ``key_fn(value)``,
    a ``K``."""

    def __init__(self, topology: Topology, name: str, key_fn: Callable[[V_co], K]):
        super().__init__(topology, name, HASH)
        self.key_fn = key_fn

    def _input(self) -> Input:
        return Input(self.name, HASH, self.key_fn)

    @overload
    def reduce(self, name: str,
               fn: _aggregations.Aggregation[V_co, Any, R]
               | Callable[[], _aggregations.Aggregation[V_co, Any, R]], *,
               parallelism: int | None = None) -> Stream[tuple[K, R]]: ...

    @overload
    def reduce(self, name: str, fn: Callable[[A, V_co], A], initial: A, *,
               parallelism: int | None = None) -> Stream[tuple[K, A]]: ...

    def reduce(self, name: str, fn: Any, initial: Any = _NO_INITIAL, *,
               parallelism: int | None = None) -> Stream[Any]:
        """Running fold per key: emits ``(key, acc)`` after every input, where
        ``acc = fn(acc, value)`` starting from ``initial``.

        ``fn`` may instead be an aggregation (`bastion.aggregations`, or its class,
        made with no arguments), without ``initial``: then ``acc = agg.add(acc,
        value)`` from ``agg.create()``, and it emits ``(key, agg.result(acc))`` after
        every input. The built-ins (``Count``, ``Sum``, ``Min``, ``Max``, ``Mean``)
        fold a batch in C while its values are plain numbers (exact ints and floats),
        without a Python call per record, and with the very results of their Python
        methods; any other value takes the Python path."""
        if _makes_aggregations(fn):
            fn = fn()
        if isinstance(fn, _aggregations.Aggregation) and not isinstance(fn, type):
            if initial is not _NO_INITIAL:
                raise TopologyError(f"reduce {name!r}: an aggregation starts from its "
                                    "create(); drop initial")
            self.topology._add(name, "reduce", parallelism, [self._input()], agg=fn)
            return Stream(self.topology, name)
        if initial is _NO_INITIAL:
            raise TopologyError(f"reduce {name!r}: a reduce function needs initial (the "
                                "accumulator of a new key), or pass an aggregation such "
                                "as bn.aggregations.Count()")
        return self._unary("reduce", name, fn, parallelism, initial=initial)

    def stateful_map(self, name: str, fn: Callable[[S, V_co], tuple[S, U]],
                     initial: S, *, parallelism: int | None = None) -> Stream[U]:
        """Per-key state machine: ``fn(state, value) -> (state, out)``; emits ``out``."""
        return self._unary("stateful_map", name, fn, parallelism, initial=initial)

    def window(self, spec: _windows.WindowSpec) -> WindowedStream[K, V_co]:
        if not isinstance(spec, (_windows.Tumbling, _windows.Sliding, _windows.Count)):
            raise TopologyError(f"window after {self.name!r}: expected a bn.windows spec, "
                                f"got {spec!r}")
        return WindowedStream(self, spec)

    def join(self, other: KeyedStream[K, W], name: str, *, window: _windows.WindowSpec,
             parallelism: int | None = None) -> Stream[tuple[K, V_co, W]]:
        """Emit ``(key, a_value, b_value)`` for every pair of records with the same key in
        the same time window (``a`` from this stream, ``b`` from ``other``)."""
        if not isinstance(other, KeyedStream):
            raise TopologyError(
                f"join {name!r}: both inputs must be keyed streams; call .key_by(fn) on "
                f"{getattr(other, 'name', other)!r} first"
            )
        if other.topology is not self.topology:
            raise TopologyError(f"join {name!r}: both inputs must belong to one topology")
        if not isinstance(window, (_windows.Tumbling, _windows.Sliding)):
            raise TopologyError(f"join {name!r}: window must be bn.windows.Tumbling or "
                                f"Sliding (event-time), got {window!r}")
        self.topology._add(name, "join", parallelism, [self._input(), other._input()],
                           spec=window)
        return Stream(self.topology, name)


class WindowedStream(Generic[K, V_co]):
    """A keyed stream cut into windows; `aggregate` turns each window into one result."""

    def __init__(self, keyed: KeyedStream[K, V_co], spec: _windows.WindowSpec):
        self.keyed = keyed
        self.spec = spec

    def aggregate(self, name: str,
                  agg: _aggregations.Aggregation[V_co, Any, R]
                  | Callable[[], _aggregations.Aggregation[V_co, Any, R]], *,
                  parallelism: int | None = None) -> Stream[tuple[K, float, float, R]]:
        """Emit ``(key, window_start, window_end, agg.result(acc))`` when a window fires
        (for ``Count`` windows: the first and last record's event time). ``agg`` is an
        aggregation or its class (made with no arguments). In ``Tumbling`` and
        ``Sliding`` windows the built-ins (``Count``, ``Sum``, ``Min``, ``Max``,
        ``Mean``) fold a batch in C while its values are plain numbers, with the
        results of their Python methods (see `KeyedStream.reduce`)."""
        if isinstance(agg, type):
            agg = agg()
        if not isinstance(agg, _aggregations.Aggregation):
            raise TopologyError(f"window aggregate {name!r}: {agg!r} lacks create/add/merge/"
                                "result; use bn.aggregations or an object with those methods")
        topo = self.keyed.topology
        topo._add(name, "window", parallelism, [self.keyed._input()], spec=self.spec, agg=agg)
        return Stream(topo, name)


__all__ = ["KeyedStream", "Stream", "Topology", "WindowedStream", "check_name"]
