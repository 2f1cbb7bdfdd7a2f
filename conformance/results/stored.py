"""Outputs stored in a result (``extra.outputs``) so that ``normconf judge`` can compare them again under
later tolerances and ledgers: base64 of a compressed .npz, half precision widened exactly to float32."""

from __future__ import annotations

import base64
import io
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

# At most this many elements of outputs are stored per result (float32, or float64 for float64).
ELEMENTS = 8192


def encode(actual: Mapping[str, np.ndarray], names: Sequence[str]) -> str | None:
    """The named outputs as base64 of a compressed .npz (half precision widened exactly to float32);
    None when they hold more than ``ELEMENTS`` elements."""
    arrays = {name: np.asarray(actual[name]) for name in names if name in actual}
    if sum(a.size for a in arrays.values()) > ELEMENTS:
        return None
    buffer = io.BytesIO()
    save: Any = np.savez_compressed  # its stub types **kwds as its allow_pickle flag
    save(buffer, **{k: a.astype(_wide(a)) for k, a in arrays.items()})
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def _wide(a: np.ndarray) -> type[np.floating[Any]]:
    return np.float64 if a.dtype == np.float64 else np.float32


def decode(text: str) -> dict[str, np.ndarray]:
    with np.load(io.BytesIO(base64.b64decode(text)), allow_pickle=False) as data:
        return {name: data[name] for name in data.files}
