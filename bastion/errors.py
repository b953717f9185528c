"""Errors a Bastion user can see.

Every error names the thing that is wrong — the operator, the record, the resource —
and, where there is one, what to do about it. `TopologyError` is raised while a
topology is built or validated, always before anything is deployed; `UDFError` carries
a user function's exception out of a running job when `fail_fast=True`; `JobFailedError`
reports a job that stopped for any other reason, and its subclasses say which reasons
need the user's attention: `SinkCommitError` (a sink kept failing to apply committed
outputs) and `NoUsableCheckpointError` (after a failure, no checkpoint could be restored
without committing some outputs twice). `UnstorableValueError` is both a `UDFError`
and a `JobFailedError`: a value the job had to store or send — an operator's state, a
sink's records — has a type no codec encodes (a lock, a file, a class of the user's
without a codec); it names the operator and the type, and ends the job at once, since
a restart would only meet the same value again. `StorageError` (a store that cannot
be reached, a bad URL, missing credentials) is one too: `BastionError` is defined by
the storage layer, which imports nothing of ours, and re-exported here.
"""

from __future__ import annotations

# The one root class; storage defines it because storage may import nothing above it.
from bastion.storage.errors import BastionError, StorageError


class TopologyError(BastionError, ValueError):
    """A malformed topology, found before deploy. The message names the operator."""


class UDFError(BastionError):
    """A user function raised and the job runs with ``fail_fast=True``."""

    def __init__(self, operator: str, index: int, value: object, error: str):
        self.operator = operator
        self.index = index
        self.value = value
        self.error = error
        super().__init__(
            f"operator {operator!r} (instance {index}) failed on record {value!r}: {error}"
        )

    def __reduce__(self):
        return (UDFError, (self.operator, self.index, self.value, self.error))


class JobFailedError(BastionError):
    """A job stopped because an instance failed for a reason other than a user function.
    ``job_id`` names the job (what `bn.run(resume_from=...)` takes). The message is
    what went wrong, on one line; ``details`` holds the worker's traceback when there
    is one (for a bug report: a user reads the message)."""

    job_id: str | None = None
    details: str | None = None


class UnserialisableError(TypeError):
    """A value no codec covers (`bastion.runtime.durable`); ``type_name`` names its
    type, so that whoever stores the value — a task, a protocol's log — can name the
    type and its own operator in the error a user sees (`UnstorableValueError`)."""

    def __init__(self, message: str, type_name: str):
        super().__init__(message)
        self.type_name = type_name

    def __reduce__(self):
        return (UnserialisableError, (str(self), self.type_name))


class UnstorableValueError(UDFError, JobFailedError, TypeError):
    """A value the job must store or send has a type no codec encodes: an operator's
    state at a checkpoint, a sink's records as they are staged. A user error, found
    only when the first such value is stored: ``operator`` and ``index`` name the
    instance (``kind`` says whether it is an "operator" or a "sink"), ``type_name`` the
    value's type, ``what`` what could not be done ("its state cannot be stored"). The
    message ends with what to do: register a codec, or keep such values out.

    It is a `UDFError` because the user's code made the value — the job master ends the
    job on it as on any user function's error, never restarting (a restart would meet
    the same value) — a `JobFailedError` because the job ended (``job_id``), and a
    `TypeError`, what Python raises for a value of the wrong type (and what this error
    was before it had a class of its own)."""

    def __init__(self, operator: str, index: int, type_name: str, what: str, error: str,
                 kind: str = "operator"):
        self.type_name, self.what, self.kind = type_name, what, kind
        self.operator, self.index, self.value, self.error = operator, index, None, error
        BastionError.__init__(
            self, f"{kind} {operator!r} (instance {index}): {what}: {error}")

    def __reduce__(self):
        # Ray carries it from the worker to the driver pickled; job_id is set there.
        return (UnstorableValueError, (self.operator, self.index, self.type_name,
                                       self.what, self.error, self.kind))


class PeerLostError(BastionError):
    """A task could not send a frame to a peer worker: the connection between the two
    processes broke (the peer died, or its node). Internal: the job master recovers
    from it as from the peer's death, and a user sees it only in the job's events."""


class SinkCommitError(JobFailedError):
    """A sink failed to apply a commit point's outputs, again after every retry. The
    message names the sink, the commit point and the sink's own error."""


class NoUsableCheckpointError(JobFailedError):
    """A recovery found no checkpoint it could restore: every newer one is damaged
    (each is named with its bad blob), and restarting from an older one — or from the
    beginning — would commit outputs a second time that were committed already."""


__all__ = ["BastionError", "JobFailedError", "NoUsableCheckpointError", "PeerLostError",
           "SinkCommitError", "UnstorableValueError",
           "StorageError", "TopologyError", "UDFError"]
