"""The triton backend's host-overhead benchmark (pytest-benchmark): ``pytest backends/triton/bench``."""
