"""Errors a Bastion user can see.

Every error names the thing that is wrong — the operator, the record, the resource —
and, where there is one, what to do about it. `TopologyError` is raised while a
topology is built or validated, always before anything is deployed; `UDFError` carries
a user function's exception out of a running job when `fail_fast=True`; `JobFailedError`
reports a job that stopped for any other reason.
"""

from __future__ import annotations


class BastionError(Exception):
    """Base class of every error Bastion raises on purpose."""


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
    """A job stopped because an instance failed for a reason other than a user function."""
