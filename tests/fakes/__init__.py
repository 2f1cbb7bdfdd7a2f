"""Backends that are deliberately wrong in one known way, each caught (and named) by a check.

Each module registers its fakes when imported: load one into a run with ``-p fakes.<module>`` and
tests/ on PYTHONPATH (``support.suite.run_suite`` does both).
"""
