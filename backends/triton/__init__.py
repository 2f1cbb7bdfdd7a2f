"""triton, triton-inplace: normconf's own fused Triton kernels (``kernels``), their launch path, and the
ahead-of-time compiler for GPU targets (``kernels.aot``)."""
