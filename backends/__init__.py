"""Built-in backend adapters, registered through the ``normconf.backends`` entry points like any other.

Each adapter imports its framework (torch, ...) itself; nothing here is imported by ``conformance``.
"""
