"""Dtype names of the contract and their NumPy types, unit roundoffs and ULP sizes.

bfloat16 is carried as ``ml_dtypes.bfloat16`` so inputs hold exactly the bits a backend sees.
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

DTYPES: tuple[str, ...] = ("float64", "float32", "float16", "bfloat16")

_NUMPY: dict[str, Any] = {
    "float64": np.float64,
    "float32": np.float32,
    "float16": np.float16,
    "bfloat16": ml_dtypes.bfloat16,
}

# Explicit significand bits (the implicit leading one excluded): unit roundoff is 2**-(bits + 1).
_MANTISSA_BITS: dict[str, int] = {"float64": 52, "float32": 23, "float16": 10, "bfloat16": 7}


def numpy_dtype(name: str) -> np.dtype[Any]:
    """The NumPy dtype for a contract dtype name."""
    dtype: np.dtype[Any] = np.dtype(_NUMPY[name])
    return dtype


def unit_roundoff(name: str) -> float:
    """Half the distance from 1.0 to the next representable value: one rounding's relative error."""
    return float(2.0 ** -(_MANTISSA_BITS[name] + 1))


def stats_dtype(name: str) -> str:
    """Precision the reference semantics require for statistics: at least float32."""
    return "float64" if name == "float64" else "float32"


def finfo(name: str) -> Any:
    """``finfo`` that also understands bfloat16."""
    return ml_dtypes.finfo(_NUMPY[name])  # type: ignore[no-untyped-call]


def round_to(values: np.ndarray, name: str) -> np.ndarray:
    """Round float64 values to a contract dtype (round-to-nearest-even), C-contiguous."""
    return np.ascontiguousarray(np.asarray(values, dtype=np.float64).astype(numpy_dtype(name)))


def truncating_bfloat16(values: np.ndarray) -> np.ndarray:
    """float32 values rounded to bfloat16 as OpenVINO's CPU plugin's Convert does it,
    (bits + ((bits & 0x10000) >> 1)) >> 16: half an ulp is added only when the kept last bit is odd, so
    an even kept bit truncates toward zero (ties and all); as float64. Non-finite values pass through."""
    with np.errstate(over="ignore", invalid="ignore"):
        f32 = np.ascontiguousarray(np.asarray(values, dtype=np.float64).astype(np.float32))
    bits = f32.view(np.uint32).astype(np.uint64)
    kept = ((bits + ((bits & 0x10000) >> 1)) >> 16) << 16
    finite = np.isfinite(f32)
    out = np.where(finite, kept.astype(np.uint32).view(np.float32), f32)
    return np.asarray(out, dtype=np.float64)


def ulp(values: np.ndarray, name: str) -> np.ndarray:
    """Spacing of the dtype at each value's magnitude (subnormal spacing near zero), as float64."""
    info = finfo(name)
    magnitude = np.abs(values.astype(np.float64))
    tiny = float(info.tiny)
    with np.errstate(divide="ignore", invalid="ignore"):
        exponent = np.floor(np.log2(np.maximum(magnitude, tiny)))
    spacing = np.exp2(exponent - _MANTISSA_BITS[name])
    return np.where(np.isfinite(spacing), spacing, np.inf)
