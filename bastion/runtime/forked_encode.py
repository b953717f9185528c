"""Copy-on-write snapshots: a large state encoded in a forked child, off the task's loop.

A checkpoint captures a task's state as it is when the checkpoint reaches the task, and
the task cannot move on until the capture is done: it must not change the state under
an encoder. Encoding is what costs — about 30 ns a key, so 0.12 s for 4 M keys and
half a second for 16 M, all of which the task's loop (and every task of its worker)
moves no record. Storing the blob already happens in the background.

``fork()`` gives a child process the parent's memory as it is at that instant, shared
copy-on-write. The child encodes that frozen state — exactly what the task would have
encoded on its loop at the same moment — and writes the blob to an anonymous
in-memory file (``memfd_create``), while the parent goes on processing; Redis writes
its snapshots (BGSAVE) the same way. What the parent pays is the fork itself (copying
its page tables: about 12 ms for a worker of 600 MB here) and a copy of each page it
writes while the child runs. The child only
reads: the encoder reads objects without writing them, and the child's collector is
off, since a collection would write to every object's header and so copy every page.

The child is confined: it runs the encode and nothing else, writes its answer to the
file (a status, a length, the bytes) and leaves with ``os._exit`` — no exit handlers,
no buffers flushed, nothing of the parent's threads or sockets used. It dies with the
parent (``PR_SET_PDEATHSIG``), so a killed worker leaves no encoder behind. A worker
thread of the parent waits for the child to exit, then maps the file (the blob is
uploaded from the file's own pages, never copied) and
charges the child's CPU time to the task (the job's CPU figures count it). Not a
pipe: a pipe holds 64 KiB, and a reader thread takes the GIL back after every read —
which a busy event loop hands over only once a switch interval (at CPython's default
5 ms, 90 MB took 10 s to cross one). A child that fails — killed, or an
encoder's error — fails that checkpoint, as a failed upload does: nothing half-written
is ever stored or acknowledged. A value no codec stores is reported as the same
`UnstorableValueError`, naming the operator, that the loop's own encode raises.

Used where ``fork`` is (Linux) and for states of at least ``State.fork_min_keys`` keys
(`start` returns None elsewhere and the caller encodes on its loop).
"""

from __future__ import annotations

import asyncio
import ctypes
import gc
import json
import mmap
import os
import signal
import struct
import sys
import threading
import weakref
from dataclasses import dataclass, field
from typing import Callable

from bastion.errors import UnstorableValueError

__all__ = ["ForkedEncode", "ForkedEncodeError", "start"]

# The child's answer, at the start of its file: a status byte and the payload's
# length, then the payload.
_HEADER = struct.Struct("<BQ")
_OK, _UNSTORABLE, _FAILED = 0, 1, 2
# An encoder's error message is cut to this (a blob is read into a buffer of its
# declared size only once the file holds exactly that much).
_MESSAGE_BYTES = 4096
_PR_SET_PDEATHSIG = 1

_libc = ctypes.CDLL(None, use_errno=True) if sys.platform == "linux" else None


class ForkedEncodeError(RuntimeError):
    """The child encoding a snapshot did not deliver it: it was killed, exited early,
    or its encoder failed. The checkpoint fails; a later one is taken afresh."""


@dataclass
class ForkedEncode:
    """One child encoding one snapshot: `result` waits for its blob."""

    pid: int
    fd: int  # the in-memory file the child writes its answer to
    what: str  # for errors: whose snapshot, e.g. "task sum[0]"
    cpu_s: float = 0.0  # the child's CPU seconds, once reaped
    # An encode dropped unread (its checkpoint abandoned before its upload began)
    # must not go on using a core and its image of the parent's memory, nor leave a
    # zombie and a file behind: it is killed, reaped, and the file closed.
    _abandoned: weakref.finalize = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._abandoned = weakref.finalize(self, _abandon, self.pid, self.fd)

    async def result(self) -> memoryview:
        """The blob, read off the loop. `ForkedEncodeError` if the child failed;
        `UnstorableValueError` if the state holds a value no codec stores."""
        return await asyncio.to_thread(self.collect)

    def collect(self) -> memoryview:
        """`result`, blocking: wait for the child to exit, check its answer, and map
        it: the blob is the file's own pages, read-only, not a copy."""
        self._abandoned.detach()
        try:
            _, wait_status, usage = os.wait4(self.pid, 0)
            self.cpu_s = usage.ru_utime + usage.ru_stime
            size = os.fstat(self.fd).st_size
            header = os.pread(self.fd, _HEADER.size, 0)
            status, length = _HEADER.unpack(header) if len(header) == _HEADER.size else (
                _OK, -1)
            # the whole answer, as declared, or the child did not finish writing it
            short = length < 0 or size != _HEADER.size + length or (
                status != _OK and length > _MESSAGE_BYTES)
            payload = memoryview(b"") if short else _mapped(self.fd, size)[_HEADER.size:]
        finally:
            os.close(self.fd)
        if short or wait_status != 0:
            raise ForkedEncodeError(
                f"the process encoding {self.what}'s snapshot (pid {self.pid}) "
                f"{_describe_exit(wait_status)} before delivering it")
        if status == _UNSTORABLE:
            raise UnstorableValueError(*json.loads(bytes(payload)))
        if status != _OK:
            raise ForkedEncodeError(f"encoding {self.what}'s snapshot failed: "
                                    f"{bytes(payload).decode(errors='replace')}")
        return payload


def available() -> bool:
    """Whether `start` can fork an encoder here (Linux: ``fork``, ``memfd_create`` and
    ``prctl``)."""
    return _libc is not None and hasattr(os, "fork") and hasattr(os, "memfd_create")


def start(encode: Callable[[], bytes], what: str) -> ForkedEncode | None:
    """Fork a child that runs ``encode`` on the memory as it is now and sends its
    result back; None where ``fork`` is not available (the caller encodes itself)."""
    if not available():
        return None
    parent = os.getpid()
    fd = os.memfd_create("bastion-snapshot", os.MFD_CLOEXEC)
    try:
        pid = os.fork()
    except OSError:  # no memory or processes left for a child: encode on the loop
        os.close(fd)
        return None
    if pid == 0:  # the child: never returns
        _child(encode, fd, parent)
    return ForkedEncode(pid, fd, what)


def _child(encode: Callable[[], bytes], fd: int, parent: int) -> None:
    code = 1
    try:
        gc.disable()  # a collection would write to every object: every page copied
        _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)  # type: ignore[union-attr]
        if os.getppid() != parent:  # the parent died before the line above
            os._exit(1)
        for number in (signal.SIGINT, signal.SIGTERM):
            signal.signal(number, signal.SIG_DFL)  # not the worker's handlers
        try:
            status, payload = _OK, encode()
        except UnstorableValueError as exc:
            status, payload = _UNSTORABLE, json.dumps(
                [exc.operator, exc.index, exc.type_name, exc.what, exc.error[:1024],
                 exc.kind]).encode()
        except BaseException as exc:  # noqa: BLE001 - reported to the parent
            status = _FAILED
            payload = f"{type(exc).__name__}: {exc}".encode(errors="replace")[:_MESSAGE_BYTES]
        _write_all(fd, _HEADER.pack(status, len(payload)))
        _write_all(fd, payload)
        code = 0
    finally:
        os._exit(code)


def _abandon(pid: int, fd: int) -> None:
    os.close(fd)
    # not reaped yet, so the pid is still this child's
    os.kill(pid, signal.SIGKILL)
    threading.Thread(target=os.waitpid, args=(pid, 0), daemon=True,
                     name=f"bastion-reap {pid}").start()


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _mapped(fd: int, size: int) -> memoryview:
    """The file's ``size`` bytes, mapped read-only with every page in place (one call,
    not a fault per page). Reading them into a buffer would write 100 MB of fresh
    pages for a snapshot of 16 M keys, on a core the task's loop shares. The mapping
    holds its own reference to the file, so it outlives the descriptor and is
    unmapped when the last view of it goes."""
    flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
    return memoryview(mmap.mmap(fd, size, flags=flags, prot=mmap.PROT_READ))


def _describe_exit(wait_status: int) -> str:
    if os.WIFSIGNALED(wait_status):
        return f"was killed by signal {os.WTERMSIG(wait_status)}"
    return f"exited with status {os.waitstatus_to_exitcode(wait_status)}"
