"""Benchmarks over the conformance cases: same Case ids, same ``prepare()``, only call + sync timed.

``pytest conformance/bench --benchmark-only`` (pytest-benchmark); see docs/benchmarks.md.
"""
