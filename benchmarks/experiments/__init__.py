"""The sections of ``docs/results.md``: one module per paper, and ``peers``.

Each module defines ``SECTION`` (`bastion.bench.results.Section`): the paper, its
experiments (a benchmark script of ``benchmarks/`` and its arguments at full and quick
size) and how each experiment's figures become rows beside the paper's own figures.
``benchmarks/reproduce.py`` runs them and writes the page.
"""
