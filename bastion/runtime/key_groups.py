"""Key groups: how keyed state is addressed, so that a job can change its parallelism.

A keyed operator's state is split by key. If a key's instance were ``hash(key) %
parallelism``, every key would move when the parallelism changes, and a job resumed
at another parallelism would have to read every old instance's state to find its
keys. Instead each key belongs to one of a fixed number of *key groups*
(`key_group`: the key's `stable_hash`, mixed, modulo ``KEY_GROUPS``), and each
instance owns a contiguous range of groups: instance ``i`` of ``p`` owns groups ``[ceil(i·G/p), ceil((i+1)·G/p))``. So a
key's group never changes, and an instance of a rescaled job reads only the old
instances whose ranges overlap its own, keeping the keys of its groups
(`bastion.runtime.savepoint`). This is Flink's scheme (``maxParallelism``, 128 by
default for small jobs); as there, the number of groups bounds a keyed operator's
parallelism.

Routing (`bastion.runtime.instance.Router`) and restoring a rescaled state use the
same two functions below, which is what makes a rescaled restore exact.
"""

from __future__ import annotations

from typing import Any

from bastion.runtime.records import stable_hash

# The number of key groups of every keyed operator: the most instances one can have.
KEY_GROUPS = 128


def group_of_hash(key_hash: int) -> int:
    """The key group of the key whose `stable_hash` is ``key_hash``. The hash is mixed
    first (murmur3's 32-bit finalizer, as Flink mixes ``hashCode``): a CRC32 is
    linear, and keys that differ in one character (``"p0"`` … ``"p9"``) share the
    bits that pick a range of groups — unmixed, all ten went to one of two
    instances."""
    h = key_hash & 0xFFFFFFFF
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & 0xFFFFFFFF
    h ^= h >> 16
    return h % KEY_GROUPS


def key_group(key: Any) -> int:
    """The key group of ``key`` (stable across processes and restarts)."""
    return group_of_hash(stable_hash(key))


def instance_of_group(group: int, parallelism: int) -> int:
    """The instance, of ``parallelism``, that owns key group ``group``."""
    return group * parallelism // KEY_GROUPS


def instance_of_hash(key_hash: int, parallelism: int) -> int:
    """The instance owning the key whose `stable_hash` is ``key_hash``."""
    return group_of_hash(key_hash) * parallelism // KEY_GROUPS


def instance_of(key: Any, parallelism: int) -> int:
    """The instance, of ``parallelism``, a keyed operator processes ``key`` in."""
    return instance_of_group(key_group(key), parallelism)


def groups_of(index: int, parallelism: int) -> range:
    """The key groups instance ``index`` of ``parallelism`` owns."""
    return range(-(-index * KEY_GROUPS // parallelism),
                 -(-(index + 1) * KEY_GROUPS // parallelism))


__all__ = ["KEY_GROUPS", "groups_of", "instance_of", "instance_of_group", "key_group"]
