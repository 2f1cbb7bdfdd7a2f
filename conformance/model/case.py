"""The Case: one fully specified normalization problem, validated on construction.

Every semantic parameter is explicit (eps is never a library default); ``Case.id`` is the stable key
shared by pytest ids, benchmark ids and the report.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import asdict, dataclass, fields
from typing import Any

from conformance.model.dtypes import DTYPES

OPS: tuple[str, ...] = ("layer_norm", "rms_norm", "batch_norm", "add_rms_norm")
DISTS: tuple[str, ...] = (
    "normal",
    "offset",
    "near_constant",
    "constant",
    "outlier",
    "large",
    "small",
    "zeros",
)
# Capability features: what a backend declares it supports and what a case needs (Case.features;
# "backward" is asked per check, not per case).
FEATURES: tuple[str, ...] = (
    "backward",
    "training",
    "weight_offset",
    "no_weight",
    "no_bias",
    "multi_axis",
    "param_dtype",
    "momentum_none",
)
# Ops that carry a bias term; RMSNorm variants have none by definition.
_BIAS_OPS = frozenset({"layer_norm", "batch_norm"})
_ROW_OPS = frozenset({"layer_norm", "rms_norm", "add_rms_norm"})
_OFFSET_OPS = frozenset({"rms_norm", "add_rms_norm"})


class CaseError(ValueError):
    """A Case field holds a value outside its allowed set."""


def _fail(field: str, value: object, allowed: str) -> CaseError:
    return CaseError(f"{field}={value!r} is not allowed; allowed: {allowed}")


@dataclass(frozen=True)
class Case:
    """One conformance problem. See the contract table in docs/architecture.md."""

    op: str
    shape: tuple[int, ...]
    dtype: str
    eps: float
    param_dtype: str | None = None
    norm_ndim: int = 1
    weight: bool = True
    bias: bool | None = None
    weight_offset: float = 0.0
    training: bool = False
    momentum: float | None = 0.1
    dist: str = "normal"
    seed: int = 0

    def __post_init__(self) -> None:
        # Lists from JSON/TOML arrive as lists; the contract value is a tuple.
        object.__setattr__(self, "shape", tuple(self.shape))
        if self.bias is None:
            # Unset bias means "the op's usual form": LN/BN carry one, RMSNorm has none.
            object.__setattr__(self, "bias", self.op in _BIAS_OPS)
        if self.param_dtype == self.dtype:
            # One spelling per meaning, so equal cases have equal ids and inputs.
            object.__setattr__(self, "param_dtype", None)
        for check in (
            self._check_types,
            self._check_names,
            self._check_shape,
            self._check_numbers,
            self._check_op_fields,
        ):
            check()

    def _check_types(self) -> None:
        """Wrong types fail here by name (a JSON "false" string must not mean True)."""
        for name in ("weight", "bias", "training"):
            if not isinstance(getattr(self, name), bool):
                raise _fail(name, getattr(self, name), "true or false")
        if isinstance(self.norm_ndim, bool) or not isinstance(self.norm_ndim, int):
            raise _fail("norm_ndim", self.norm_ndim, "an integer")
        numbers = {"weight_offset": self.weight_offset}
        if self.momentum is not None:
            numbers["momentum"] = self.momentum
        for name, value in numbers.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise _fail(name, value, "a number" + (" or None" if name == "momentum" else ""))

    def _check_names(self) -> None:
        if self.op not in OPS:
            raise _fail("op", self.op, ", ".join(OPS))
        if self.dtype not in DTYPES:
            raise _fail("dtype", self.dtype, ", ".join(DTYPES))
        if self.param_dtype is not None and self.param_dtype not in DTYPES:
            raise _fail("param_dtype", self.param_dtype, "None, " + ", ".join(DTYPES))
        if self.dist not in DISTS:
            raise _fail("dist", self.dist, ", ".join(DISTS))

    def _check_shape(self) -> None:
        if not self.shape or not all(isinstance(d, int) and d >= 1 for d in self.shape):
            raise _fail("shape", self.shape, "a non-empty tuple of positive integers")
        if self.op in _ROW_OPS and not 1 <= self.norm_ndim <= len(self.shape):
            raise _fail("norm_ndim", self.norm_ndim, f"1..{len(self.shape)} for shape {self.shape}")
        if self.op == "batch_norm":
            if len(self.shape) < 2:
                raise _fail("shape", self.shape, "(N, C) or (N, C, L...) for op=batch_norm")
            if self.norm_ndim != 1:
                raise _fail("norm_ndim", self.norm_ndim, "1 for op=batch_norm (channel axis is 1)")
            if self.training and self.shape[0] * math.prod(self.shape[2:]) < 2:
                # The unbiased running variance divides by count - 1.
                raise _fail("shape", self.shape, "more than one value per channel when training")

    def _check_numbers(self) -> None:
        if isinstance(self.eps, bool) or not isinstance(self.eps, (int, float)):
            raise _fail("eps", self.eps, "a positive finite float")
        if not (math.isfinite(self.eps) and self.eps > 0):
            raise _fail("eps", self.eps, "a positive finite float")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise _fail("seed", self.seed, "a non-negative integer")
        if not math.isfinite(self.weight_offset):
            raise _fail("weight_offset", self.weight_offset, "a finite float")
        if self.momentum is not None and not 0.0 <= self.momentum <= 1.0:
            raise _fail("momentum", self.momentum, "None or a float in [0, 1]")

    def _check_op_fields(self) -> None:
        if self.bias and self.op not in _BIAS_OPS:
            raise _fail("bias", self.bias, f"False for op={self.op}")
        if self.weight_offset != 0.0 and self.op not in _OFFSET_OPS:
            raise _fail("weight_offset", self.weight_offset, f"0.0 for op={self.op}")
        if self.weight_offset != 0.0 and not self.weight:
            raise _fail("weight_offset", self.weight_offset, "0.0 when weight=False")
        if self.op != "batch_norm" and self.training:
            raise _fail("training", self.training, f"False for op={self.op}")
        if not self.training and self.momentum != 0.1:
            # momentum only matters for a training update; one spelling keeps ids unique.
            raise _fail("momentum", self.momentum, f"0.1 (unused) for op={self.op} with training=False")

    @property
    def params(self) -> str:
        """The former name of ``weight_dtype``, kept for adapters written against it."""
        warnings.warn("Case.params is deprecated; use Case.weight_dtype", DeprecationWarning, stacklevel=2)
        return self.weight_dtype

    @property
    def weight_dtype(self) -> str:
        """Dtype of weight, bias and running statistics: ``param_dtype``, or ``dtype`` where that is None."""
        return self.param_dtype or self.dtype

    @property
    def id(self) -> str:
        parts = [self.op, self.dtype]
        if self.param_dtype is not None and self.param_dtype != self.dtype:
            parts.append(f"p{self.param_dtype}")
        parts += ["x".join(map(str, self.shape)), f"eps{float(self.eps)!r}", self.dist]
        parts += self._flag_parts()
        if self.seed:
            parts.append(f"s{self.seed}")
        return "-".join(parts)

    def _flag_parts(self) -> list[str]:
        flags = []
        if self.norm_ndim != 1:
            flags.append(f"nd{self.norm_ndim}")
        if not self.weight:
            flags.append("now")
        if not self.bias and self.op in _BIAS_OPS:
            flags.append("nob")
        if self.weight_offset != 0.0:
            flags.append(f"off{float(self.weight_offset)!r}")
        if self.op == "batch_norm" and self.training:
            flags.append(f"train-m{float(self.momentum)!r}" if self.momentum is not None else "train-mNone")
        return flags

    @property
    def features(self) -> frozenset[str]:
        """Capability features this case needs (gradients are asked separately)."""
        needs = {
            "training": self.training,
            "weight_offset": self.weight_offset != 0.0,
            "no_weight": not self.weight,
            "no_bias": not self.bias and self.op in _BIAS_OPS,
            "multi_axis": self.norm_ndim > 1,
            "param_dtype": self.weight_dtype != self.dtype,
            "momentum_none": self.training and self.momentum is None,
        }
        return frozenset(name for name, needed in needs.items() if needed)

    def to_dict(self) -> dict[str, Any]:
        record = asdict(self)
        record["shape"] = list(self.shape)
        record["id"] = self.id
        return record

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Case:
        """Build a Case from plain data (a cases file entry, a results record); ``id`` is ignored."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known - {"id"})
        if unknown:
            raise CaseError(f"unknown Case field(s) {unknown}; allowed: {', '.join(sorted(known))}")
        missing = sorted(
            f.name for f in fields(cls) if f.name in {"op", "shape", "dtype", "eps"} and f.name not in data
        )
        if missing:
            raise CaseError(f"missing Case field(s) {missing}")
        return cls(**{k: v for k, v in data.items() if k != "id"})

    @property
    def rows(self) -> int:
        """Independent normalization groups (LN/RMS rows); BN: values per channel."""
        if self.op == "batch_norm":
            return self.shape[0] * math.prod(self.shape[2:])
        return math.prod(self.shape[: len(self.shape) - self.norm_ndim])

    @property
    def param_shape(self) -> tuple[int, ...]:
        if self.op == "batch_norm":
            return (self.shape[1],)
        return self.shape[len(self.shape) - self.norm_ndim :]
