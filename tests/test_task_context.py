"""The protocol seam's task side: `TaskContext` is who the task is plus six narrow views
(inputs, outputs, state, chain, sources, sinks). A protocol written against the flat
context of earlier releases gets an error naming where each call went."""

from __future__ import annotations

import inspect

import pytest

import bastion as bn
from bastion.errors import JobFailedError
from bastion.protocols.base import (MOVED_CONTEXT_CALLS, TaskContext, TaskProtocol,
                                    moved_context_call)
from bastion.protocols.none import NoProtocol


def _views() -> dict[str, type]:
    hints = inspect.get_annotations(TaskContext, eval_str=True)
    return {name: cls for name, cls in hints.items()
            if inspect.isclass(cls) and inspect.isabstract(cls)}


def unresolved(moved: dict[str, str]) -> list[str]:
    """Entries of ``moved`` whose new place is not an abstract call of a view, or whose
    old name is still an attribute of `TaskContext`."""
    views, wrong = _views(), []
    for old, new in moved.items():
        view, _, call = new.partition(".")
        cls = views.get(view)
        if cls is None or call not in cls.__abstractmethods__ or hasattr(TaskContext, old):
            wrong.append(old)
    return wrong


def test_the_context_is_six_views_and_nothing_flat():
    assert sorted(_views()) == ["chain", "inputs", "outputs", "sinks", "sources", "state"]
    flat = {name for name in TaskContext.__abstractmethods__}
    assert flat == {"watermark", "send_acks", "observe_latencies"}


def test_every_moved_call_names_a_call_that_exists():
    assert unresolved(MOVED_CONTEXT_CALLS) == []
    # the check can fail: a pointer to a view that has no such call, and an old name
    # that is still there
    assert unresolved({"flush_outputs": "outputs.flush_all",
                       "send_acks": "outputs.send_control"}) == ["flush_outputs", "send_acks"]


def test_the_message_names_the_new_call():
    assert moved_context_call("flush_outputs") == (
        "TaskContext.flush_outputs() moved: use task.outputs.flush()")
    assert "gone" in moved_context_call("count_protocol_bytes")
    assert moved_context_call("no_such_call") is None


class _FlatTask(TaskProtocol):
    async def on_start(self) -> None:
        await self.task.flush_outputs()   # the flat context of earlier releases


class _FlatProtocol(NoProtocol):
    def task_protocol(self, task):
        return _FlatTask(task)


@pytest.mark.usefixtures("ray_session")
def test_a_protocol_that_calls_the_flat_context_fails_naming_the_new_call(tmp_path):
    topology = bn.Topology("flat")
    topology.source("numbers", bn.sources.Generator(lambda i: i, count=10)) \
        .sink("out", bn.sinks.Collect())
    with pytest.raises(JobFailedError, match=r"flush_outputs\(\) moved: use "
                                             r"task\.outputs\.flush\(\)"):
        bn.run(topology, _FlatProtocol(), storage=f"local://{tmp_path}", fail_fast=True)
