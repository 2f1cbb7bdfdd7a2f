"""Convention translations shared by adapters of every library; NumPy only (no torch, no onnx).

An adapter whose library lacks a parameter of the contract translates it exactly here.
"""

from __future__ import annotations

import numpy as np

from conformance.model.dtypes import round_to


def offset_scale(weight: np.ndarray, offset: float, param_dtype: str) -> np.ndarray:
    """``offset + weight`` held exactly, for libraries whose RMSNorm has no offset (Gemma's 1 + w).

    The target is the float64 value of ``offset + weight`` (the scale the float64 reference uses);
    it is stored in the narrowest of (param dtype widened to float32, float64) that holds it exactly,
    so the translation itself adds no rounding beyond the reference's own.
    """
    scale = offset + weight.astype(np.float64)
    narrow = "float64" if param_dtype == "float64" else "float32"
    held = round_to(scale, narrow)
    if np.array_equal(held.astype(np.float64), scale):
        return held
    return scale


def old_value_momentum(momentum: float) -> float:
    """The momentum of a library that weights the OLD running value (ONNX, Flax, Keras:
    ``running = k * running + (1 - k) * batch``) for PyTorch's ``m`` (``(1 - m) * running + m * batch``):
    k = 1 - m. Exact in real arithmetic; the library's own 1 - k gives back m to within an ulp of 1."""
    return 1.0 - momentum
