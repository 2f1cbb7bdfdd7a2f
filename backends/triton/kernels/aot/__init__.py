"""Ahead-of-time compilation of the Triton kernels for GPU targets this machine need not have.

Modules: targets (limits, occupancy; pure Python), resources (reading the compiler's output; pure
Python), launches (the launches the backends make for a case, recorded), build (compiling a launch for
a target and judging it), run (the enumeration over profiles and targets). launches and build import
Triton and need ``backends.triton.kernels.mode.compile_only()`` to have been called first.
"""
