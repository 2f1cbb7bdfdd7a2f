"""The conformance tests that `pytest conformance` collects; parametrized by the normconf plugin."""
