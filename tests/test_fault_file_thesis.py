"""`bn.faults.load` reads Dynamo's fault file as the thesis writes it (Tran, Listing
3.1): operator names at the top, ``enabled`` instance ids, ``faults`` by kind with
``parameters`` in microseconds, distributions as ``[min, max, mean(, std)]`` — and
it drives the same faults as the equivalent file in Bastion's own shape."""

from __future__ import annotations

import random

import pytest

import bastion as bn
from bastion.faults import FaultFileError, bounded_gap
from bastion.runtime.faults import TaskFaults

# Listing 3.1, verbatim (its "..." ends the YAML document)
LISTING_3_1 = """\
bolt1: # name of operator
  enabled: # list of enabled ids
    - 0
    - 1
  faults: # list of injectors
    timing:
      parameters: # microseconds
        mtbf:
          exponential: # Distribution
            - 100 # min
            - 900000000 # max
            - 1000000 # mean
        magnitude:
          gaussian: # Distribution
            - 75000 # min
            - 300000 # max
            - 150000 # mean
            - 37500 # std
bolt2: # name of operator
  enabled: # list of enabled ids
    - 0
...
"""

BASTION_SHAPE = """\
operators:
  bolt1:
    instances: [0, 1]
    faults:
      - timing: {phase: execute, mtbf_s: 1.0, mtbf_min_s: 0.0001, mtbf_max_s: 900.0,
                 magnitude: {gaussian: {mean: 0.15, stddev: 0.0375, min: 0.075,
                                        max: 0.3}}}
"""


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_listing_3_1_loads_verbatim_as_the_bastion_shape_does(tmp_path):
    thesis = bn.faults.load(write(tmp_path, "listing.yaml", LISTING_3_1))
    ours = bn.faults.load(write(tmp_path, "ours.yaml", BASTION_SHAPE))
    assert thesis == ours
    [timing] = thesis
    assert timing == bn.faults.Timing(
        "bolt1", instances=(0, 1), mtbf_s=1.0, mtbf_min_s=1e-4, mtbf_max_s=900.0,
        magnitude=bn.faults.Gaussian(mean=0.15, stddev=0.0375, min=0.075, max=0.3))


def stalls_of(faults, op, index, seconds):
    """The stalls one instance would inject over ``seconds`` of running time."""
    injected = TaskFaults.for_task(faults, [op], index)
    injected.started_s = 0.0
    out, t = [], 0.0
    [stalls] = injected.execute[0]
    while t < seconds:
        stall_s, count = stalls.due(0, t)
        if count:
            out.append((round(t, 3), round(stall_s, 6)))
        t += 0.01
    return out


def test_both_shapes_drive_the_same_stalls_for_the_same_seed(tmp_path):
    thesis = bn.faults.load(write(tmp_path, "listing.yaml", "seed: 3\n" + LISTING_3_1))
    ours = bn.faults.load(write(tmp_path, "ours.yaml", "seed: 3\n" + BASTION_SHAPE))
    for index in (0, 1):
        schedule = stalls_of(thesis, "bolt1", index, 20.0)
        assert schedule == stalls_of(ours, "bolt1", index, 20.0)
        assert len(schedule) > 5  # about one a second
        assert all(0.075 <= s <= 0.3 for _, s in schedule)  # the magnitude's bounds
    assert stalls_of(thesis, "bolt1", 0, 20.0) != stalls_of(thesis, "bolt1", 1, 20.0)


def test_gaps_keep_within_their_bounds():
    rng = random.Random(1)
    gaps = [bounded_gap(rng, 1.0, 0.5, 1.5) for _ in range(2000)]
    assert min(gaps) == 0.5 and max(gaps) == 1.5  # an exponential often falls outside
    assert bn.faults.Crash("x", mtbf_s=1.0, mtbf_min_s=2.0, mtbf_max_s=2.0,
                           max_crashes=3).mtbf_min_s == 2.0
    with pytest.raises(ValueError, match="mtbf_min_s .* must not exceed"):
        bn.faults.LinkOutage("x", mtbf_min_s=2.0, mtbf_max_s=1.0)


def test_the_thesis_kinds_for_messages_links_and_instances(tmp_path):
    text = """\
seed: 4
split:
  enabled: [1]
  faults:
    message: {parameters: {probability: 0.02}}
    link:
      parameters:
        mtbf: {exponential: [500000, 5000000, 2000000]}
        mttr: {gaussian: [10000, 400000, 100000, 30000]}
count:
  enabled: [0]
  faults:
    instance:
      parameters:
        mtbf: {exponential: [1000000, 9000000, 3000000]}
        mttr: {exponential: [1000000]}
        max_crashes: 2
"""
    drop, outage, crash = bn.faults.load(write(tmp_path, "kinds.yaml", text))
    assert drop == bn.faults.DropFrames("split", instances=(1,), probability=0.02, seed=4)
    assert outage == bn.faults.LinkOutage(
        "split", instances=(1,), seed=4, mtbf_s=2.0, mtbf_min_s=0.5, mtbf_max_s=5.0,
        mttr_s=0.1, mttr=bn.faults.Gaussian(mean=0.1, stddev=0.03, min=0.01, max=0.4),
        lose=True)  # the thesis's correlated model loses what is sent meanwhile
    assert crash == bn.faults.Crash("count", instances=(0,), seed=4, mtbf_s=3.0,
                                    mtbf_min_s=1.0, mtbf_max_s=9.0, mttr_s=1.0,
                                    max_crashes=2)


@pytest.mark.parametrize("text,where", [
    ("bolt1:\n  enabled: [0]\n  faults:\n    timing:\n      parameters:\n"
     "        mtbf: {exponential: [1, 2]}\n        magnitude: {constant: [5]}\n",
     r"line 6: bolt1\.faults\.timing\.parameters\.mtbf\.exponential: must be a list of 1 "
     r"or 3 numbers in microseconds"),
    ("bolt1:\n  enabled: [0]\n  faults:\n    slow: {parameters: {}}\n",
     r"line 4: bolt1\.faults\.slow: unknown field; allowed: \['timing', 'message', 'link', "
     r"'instance'\]"),
    ("bolt1:\n  enabled: [0]\n", r"no operator at the top has faults"),
])
def test_a_mistake_in_the_thesis_shape_names_its_line_and_field(tmp_path, text, where):
    with pytest.raises(FaultFileError, match=where):
        bn.faults.load(write(tmp_path, "bad.yaml", text))
