"""Benchmark workloads for Bastion.

`bastion.bench.nexmark` holds the seeded NexMark event generator, the NexMark queries
Q1, Q3, Q8 and Q12 as topology builders, and CheckMate's cyclic reachability query.
"""
