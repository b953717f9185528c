"""Dead letters are bounded: every failure is counted, only the first ones are kept.

A function that fails on every record of a long stream must not grow the workers'
and the driver's memory with one `DeadLetter` per record: each operator instance
keeps the first `bastion.runtime.operators.DEAD_LETTER_EXAMPLES` (100) as examples
and counts the rest.
"""

from __future__ import annotations

import bastion as bn
from bastion.runtime import operators
from bastion.runtime.operators import OperatorContext

FAILING = 10_000
KEPT = 100  # the README: "keeps the first 100 of each operator instance"


def reject(value: int) -> int:
    raise ValueError(f"no {value}")


def test_the_default_is_the_documented_one():
    assert operators.DEAD_LETTER_EXAMPLES == KEPT


def test_a_context_keeps_the_first_examples_and_counts_all():
    ctx = OperatorContext("op", 0, 1, fail_fast=False, dead_letter_examples=3)
    for value in range(10):
        ctx.dead_letter(value, ValueError("bad"))
    assert ctx.dead_letter_count == 10
    assert [d.value for d in ctx.dead_letters] == [0, 1, 2]


def test_a_run_with_ten_thousand_failures_counts_them_and_keeps_a_few(ray_session):
    topo = bn.Topology("all-fail")
    topo.source("src", bn.sources.Collection(range(FAILING))).map("reject", reject).sink(
        "out", bn.sinks.Collect())
    result = bn.run(topo)
    assert result.outputs["out"] == []
    assert result.metrics.dead_letters == FAILING
    assert 0 < len(result.dead_letters) <= KEPT
    assert [d.value for d in result.dead_letters] == list(range(len(result.dead_letters)))
    assert all(d.operator == "reject" and d.error == f"ValueError: no {d.value}"
               for d in result.dead_letters)


def test_each_instance_keeps_its_own_examples(ray_session):
    parallelism = 2
    topo = bn.Topology("all-fail-keyed")
    src = topo.source("src", bn.sources.Collection(range(FAILING)))
    src.key_by(lambda v: v % 2).reduce("sum", lambda acc, v: reject(v), initial=0,
                                       parallelism=parallelism).sink("out", bn.sinks.Collect())
    result = bn.run(topo)
    assert result.metrics.dead_letters == FAILING
    per_instance = {}
    for letter in result.dead_letters:
        per_instance[letter.index] = per_instance.get(letter.index, 0) + 1
    assert set(per_instance) == set(range(parallelism))
    assert all(n <= KEPT for n in per_instance.values())
