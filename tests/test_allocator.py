"""A worker's allocator keeps freed memory for reuse (`bastion.runtime.allocator`):
a large block freed and made again is written into pages already mapped, so the
second time costs next to no page faults — where glibc's defaults map fresh memory
each time. A worker given back to the pool keeps a small job's freed memory for the
next job and hands a large job's back. Counted in a fresh process (page faults, not time: the machine's speed
does not move them)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.internal

_CHILD = """
import json, resource, sys
from bastion.runtime.allocator import keep_freed_memory
tuned = keep_freed_memory() if sys.argv[1] == "tuned" else None
faults = []
for _ in range(3):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    block = bytearray(64 << 20)  # 64 MiB: above glibc's largest mmap threshold
    block[::4096] = b"x" * len(block[::4096])  # every page written
    del block
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
from bastion.runtime.allocator import release_freed_memory
rss = lambda: int(open("/proc/self/statm").read().split()[1])
# a job's 64 MiB freed: the worker keeps them for its next job
kept = release_freed_memory()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
block = bytearray(64 << 20)
block[::4096] = b"x" * len(block[::4096])
del block
after_keep = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
# a large job's peak freed: handed back
block = bytearray(256 << 20)
del block
held = rss()
trimmed = release_freed_memory()
print(json.dumps({"tuned": tuned, "faults": faults, "released_pages": held - rss(),
                  "kept": not kept, "faults_after_keep": after_keep, "trimmed": trimmed}))
"""


def _faults(mode: str) -> dict:
    out = subprocess.run([sys.executable, "-c", _CHILD, mode], check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out)


def test_a_freed_block_is_reused_not_mapped_afresh():
    pages = (64 << 20) // 4096
    tuned = _faults("tuned")
    assert tuned["tuned"] is True, "glibc's mallopt is on this machine"
    assert tuned["faults"][0] >= pages // 2  # the first time, fresh pages
    assert max(tuned["faults"][1:]) < pages // 20, tuned
    # given back to the pool after a small job, the worker keeps what it freed, and
    # the next job's blocks are written into it; after a large one (256 MiB free,
    # above KEEP_IDLE_BYTES) it hands the freed heap back to the system
    assert tuned["kept"] and tuned["faults_after_keep"] < pages // 20, tuned
    assert tuned["trimmed"], tuned
    assert tuned["released_pages"] >= (256 << 20) // 4096 // 2, tuned
    # the check can fail: glibc's defaults fault every page every time
    default = _faults("default")
    assert min(default["faults"]) >= pages // 2, default
