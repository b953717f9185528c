"""The knobs of the protocol objects (`bastion.protocols`), checked where they are made.

A protocol object carries its own settings — ``bn.protocols.Coordinated(interval_s=0.5,
retained_checkpoints=3)`` — and refuses a bad one when it is built, with a message that
names the field and its unit, as the run's options objects do (`bastion.options`).
This module holds the checks they share and `AutoInterval`, the interval chosen by the
Chiron model that a protocol may take instead of a number of seconds. It imports
nothing of Bastion: the protocols reach the runtime only through their seam
(`bastion.protocols.base`), and `bastion.options` re-exports `AutoInterval` as
``bn.AutoInterval``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


def number(value: Any) -> bool:
    """Is ``value`` a real number (not a bool, not NaN)?"""
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and not math.isnan(value))


def positive_seconds(value: Any, name: str, what: str = "") -> float:
    """``value`` as a float of seconds > 0, or `ValueError` naming ``name`` (and
    what it sets, if ``what``)."""
    if not number(value) or not value > 0:
        about = f" ({what})" if what else ""
        raise ValueError(f"{name}{about} must be a number of seconds > 0, got {value!r}")
    return float(value)


def count(value: Any, name: str, minimum: int = 1) -> int:
    """``value`` as an int >= ``minimum``, or `ValueError` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return value


@dataclass(frozen=True)
class AutoInterval:
    """A checkpoint interval chosen for a bound on the worst-case total recovery time,
    given as a protocol's ``interval_s`` (``bn.protocols.Coordinated(interval_s=
    bn.AutoInterval(trt_bound_s=5.0))``).

    Before the job starts, `bn.tune` profiles the topology and the Chiron model picks
    the interval that keeps the total recovery time under ``trt_bound_s`` seconds
    (`bastion.tuning`; over `bastion.tuning.auto_range`, or with ``tuning``'s keyword
    arguments for `bn.tune` — or ``tuning`` is a `TuningResult` already made, and
    nothing is profiled). With ``retune_every_s`` the job master re-tunes while the
    job runs (`bastion.scheduler.retune`): every ``retune_every_s`` seconds it measures
    the input rate and moves the interval when the bound would break or the optimum
    moved by more than a quarter (protocol ``coordinated`` only)."""

    trt_bound_s: float
    retune_every_s: float | None = None
    tuning: Any = None   # a mapping of `bn.tune` keyword arguments, or a TuningResult

    def __post_init__(self) -> None:
        positive_seconds(self.trt_bound_s, "trt_bound_s",
                         "the worst-case total recovery time to keep under")
        if self.retune_every_s is not None:
            positive_seconds(self.retune_every_s, "retune_every_s")
        if isinstance(self.tuning, (str, bytes)) or not (
                self.tuning is None or isinstance(self.tuning, Mapping)
                or type(self.tuning).__name__ == "TuningResult"):
            raise ValueError(f"tuning must be a mapping of bn.tune keyword arguments or a "
                             f"bn.TuningResult, got {self.tuning!r}")


def interval(value: Any, name: str = "interval_s", *, auto: bool = True,
             what: str = "how often the protocol checkpoints") -> "float | AutoInterval":
    """A protocol's ``interval_s``, checked: seconds > 0, or an `AutoInterval` where
    ``auto`` allows one."""
    if isinstance(value, AutoInterval):
        if not auto:
            raise ValueError(f"{name}: this protocol cannot tune its interval; give a "
                             "number of seconds")
        return value
    return positive_seconds(value, name, what)


def retained(value: Any) -> int:
    """A protocol's ``retained_checkpoints``, checked."""
    return count(value, "retained_checkpoints")
