"""normconf's own Triton kernels: LayerNorm, RMSNorm, the fused residual add + RMSNorm / LayerNorm (also
in place) and GroupNorm (InstanceNorm being its one-channel-per-group case), forward and backward.

Import order matters: call ``mode.select()`` before importing ``functions`` (or any kernel module), so
that on a machine without a GPU the Triton interpreter is switched on before a kernel is decorated.
"""
