"""`bastion tune` leaves no profiling jobs behind: each run's job folder (about
100 MB for a default tuning) is deleted once it is measured, unless
``keep_profiles`` (``--keep-profiles``)."""

from __future__ import annotations

import pytest

import bastion as bn
from bastion.storage import LocalStore, list_jobs

pytestmark = pytest.mark.usefixtures("ray_session")


def tiny() -> bn.Topology:
    topology = bn.Topology("tune-profiles")
    nums = topology.source("nums", bn.sources.Generator(lambda i: i % 101, count=800,
                                                         rate=400))
    nums.key_by(lambda v: v % 3).reduce("sum", lambda acc, v: acc + v, initial=0).sink(
        "out", bn.sinks.Collect())
    return topology


@pytest.mark.parametrize("keep", [False, True])
def test_profiling_jobs_are_deleted_unless_kept(tmp_path, keep):
    store = LocalStore(tmp_path / "store")
    result = bn.tune(tiny(), trt_bound_s=30, min_interval_s=0.5, max_interval_s=1.0,
                     points=2, max_rate_run_s=1.5, storage=f"local://{store.root}",
                     keep_profiles=keep, failures_per_run=1)
    ran = {result.capacity.job_id, *(m.job_id for m in result.measurements)}
    assert len(ran) == 3
    left = {job.job for job in list_jobs(store)}
    assert left == (ran if keep else set())
