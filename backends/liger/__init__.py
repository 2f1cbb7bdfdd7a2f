"""Adapters of Liger-Kernel norm modules (the opt-in ``kernels`` group)."""
