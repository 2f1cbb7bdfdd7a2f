"""Failure bundles on disk: a case, its inputs, the oracle's and the backend's outputs, the figures.

A bundle is a folder: ``bundle.json`` (cases, figures, dtype names, the replay command), and
``inputs.npz``, ``expected.npz``, ``actual.npz``. Arrays are stored losslessly: bfloat16 as its
uint16 bits, with the dtype name in ``bundle.json``, so the replayed inputs are the same bits.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from conformance.model.case import Case
from conformance.model.dtypes import DTYPES, numpy_dtype

FORMAT = 1
FILE = "bundle.json"
ARRAYS = ("inputs", "expected", "actual")


class BundleError(ValueError):
    """A bundle folder is missing, unreadable or of another format."""


@dataclass(frozen=True)
class Bundle:
    """What a bundle holds; ``meta`` is everything in bundle.json besides the arrays' dtypes."""

    case: Case
    inputs: dict[str, np.ndarray]
    expected: dict[str, np.ndarray]
    actual: dict[str, np.ndarray]
    meta: Mapping[str, Any]

    @property
    def backend(self) -> str:
        return str(self.meta["backend"])

    @property
    def grad(self) -> bool:
        return bool(self.meta["grad"])

    @property
    def outputs(self) -> tuple[str, ...]:
        return tuple(self.meta["outputs"])


def dtype_name(array: np.ndarray) -> str:
    name = array.dtype.name
    if name not in DTYPES:
        raise BundleError(f"array dtype {name} is not one of {', '.join(DTYPES)}")
    return name


def _encode(arrays: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """(arrays NumPy can store, dtype names): bfloat16 travels as its uint16 bits."""
    stored, names = {}, {}
    for key, value in arrays.items():
        array = np.ascontiguousarray(value)
        names[key] = dtype_name(array)
        stored[key] = array.view(np.uint16) if names[key] == "bfloat16" else array
    return stored, names


def _decode(stored: Mapping[str, np.ndarray], names: Mapping[str, str]) -> dict[str, np.ndarray]:
    return {key: np.ascontiguousarray(stored[key]).view(numpy_dtype(names[key])) for key in names}


def slug(backend: str, check: str, case_id: str) -> str:
    """A folder name for one failure: backend, check and case id, filesystem-safe."""
    return re.sub(r"[^A-Za-z0-9._+-]", "_", f"{backend}--{check}--{case_id}")


def replay_command(path: Path, backend: str) -> str:
    return shlex.join(["normconf", "replay", str(path), "--backend", backend])


def write(
    root: Path, name: str, meta: Mapping[str, Any], arrays: Mapping[str, Mapping[str, np.ndarray]]
) -> Path:
    """Write bundle ``name`` under ``root`` atomically (a whole folder appears, or none); returns it."""
    root.mkdir(parents=True, exist_ok=True)
    final = root / name
    staging = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=root))
    try:
        dtypes = {}
        for part in ARRAYS:
            stored, dtypes[part] = _encode(arrays[part])
            np.savez(str(staging / f"{part}.npz"), **stored)  # type: ignore[arg-type]  # numpy's stub
        record = {
            "format": FORMAT,
            **meta,
            "dtypes": dtypes,
            "replay": replay_command(final, str(meta["backend"])),
        }
        (staging / FILE).write_text(json.dumps(record, indent=1, allow_nan=False) + "\n")
        (staging / "README.md").write_text(_readme(record))
        os.chmod(staging, 0o777 & ~_umask())
        if final.exists():
            shutil.rmtree(final)
        os.replace(staging, final)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return final


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _readme(record: Mapping[str, Any]) -> str:
    case = record["case"]
    original = record.get("original_case", case)
    lines = [
        f"# {record['backend']} {record['check']} {record.get('outcome', 'failed')}: {case['id']}",
        "",
        f"Shrunk from {original['id']} (shape {original['shape']}) to shape {case['shape']}.",
        "Replay against any backend (exit 1 while it fails, 0 once it passes):",
        "",
        f"    {record['replay']}",
        "",
        "Figures of the shrunk case:",
        "",
    ]
    for c in record.get("figures", []):
        lines.append(
            f"- {c['output']}: worst_ratio {c['worst_ratio']}, max_abs {c['max_abs']}, "
            f"max_ulp {c['max_ulp']}, actual {c['actual_at_worst']} vs expected {c['expected_at_worst']} "
            f"at {c['worst_index']}"
        )
    return "\n".join(lines) + "\n"


def read(path: str | Path) -> Bundle:
    """Load a bundle folder (or its bundle.json)."""
    folder = Path(path)
    if folder.name == FILE:
        folder = folder.parent
    try:
        meta = json.loads((folder / FILE).read_text())
        arrays = {}
        for part in ARRAYS:
            with np.load(folder / f"{part}.npz") as stored:
                arrays[part] = _decode(stored, meta["dtypes"][part])
    except (OSError, ValueError, KeyError) as exc:
        raise BundleError(f"{folder}: not a readable failure bundle: {exc}") from exc
    if meta.get("format") != FORMAT:
        raise BundleError(f"{folder}: format={meta.get('format')!r} is not allowed; allowed: {FORMAT}")
    return Bundle(Case.from_dict(meta["case"]), arrays["inputs"], arrays["expected"], arrays["actual"], meta)
