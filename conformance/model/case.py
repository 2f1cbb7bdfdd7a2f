"""The Case: one fully specified normalization problem, validated on construction.

Every semantic parameter is explicit (eps is never a library default); ``Case.id`` is the stable key
shared by pytest ids, benchmark ids and the report.
"""

from __future__ import annotations

import difflib
import math
import warnings
from dataclasses import asdict, dataclass, fields
from typing import Any, Final

from conformance.model.dtypes import DTYPES

# The op names, as case ids, results files, capabilities and ledger entries spell them. Code compares
# a case's op with these constants (and the op sets below), never with a string of its own.
LAYER_NORM: Final = "layer_norm"
RMS_NORM: Final = "rms_norm"
BATCH_NORM: Final = "batch_norm"
ADD_RMS_NORM: Final = "add_rms_norm"
GROUP_NORM: Final = "group_norm"
INSTANCE_NORM: Final = "instance_norm"
ADD_LAYER_NORM: Final = "add_layer_norm"
OPS: tuple[str, ...] = (
    LAYER_NORM,
    RMS_NORM,
    BATCH_NORM,
    ADD_RMS_NORM,
    GROUP_NORM,
    INSTANCE_NORM,
    ADD_LAYER_NORM,
)
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
    "running_stats",
    "channels_last",
    "residual_dtype",
    "exact_sum",
)
# What the fused residual ops normalize: the sum as stored in the residual stream's dtype, or the
# unrounded sum (a kernel that keeps x + residual in float32 registers and rounds only the stored copy).
NORM_INPUTS: tuple[str, ...] = ("rounded", "exact")
# Memory layouts of x a backend is asked to compute on (torch's memory formats); the values are the same.
LAYOUTS: tuple[str, ...] = ("contiguous", "channels_last")
# Ops that carry a bias term; RMSNorm variants have none by definition.
_BIAS_OPS = frozenset({LAYER_NORM, BATCH_NORM, GROUP_NORM, INSTANCE_NORM, ADD_LAYER_NORM})
_ROW_OPS = frozenset({LAYER_NORM, RMS_NORM, ADD_RMS_NORM, ADD_LAYER_NORM})
# Residual add fused into the norm: h = x + residual, y = norm(h), residual_out = h.
ADD_OPS = frozenset({ADD_RMS_NORM, ADD_LAYER_NORM})
# RMSNorm and its fused residual variant: no mean is subtracted (and no bias added).
RMS_OPS = frozenset({RMS_NORM, ADD_RMS_NORM})
# LayerNorm and its fused residual variant.
LAYER_OPS = frozenset({LAYER_NORM, ADD_LAYER_NORM})
_OFFSET_OPS = RMS_OPS
# Ops with a channel axis 1 and per-channel parameters: x is (N, C, spatial...).
CHANNEL_OPS = frozenset({BATCH_NORM, GROUP_NORM, INSTANCE_NORM})
# Ops that normalize groups of channels per sample (InstanceNorm: one channel per group).
GROUP_OPS = frozenset({GROUP_NORM, INSTANCE_NORM})
# Fields added after the first results files: left out of ``to_dict`` at their usual value, so
# records of the other ops read the same as before and older readers still accept them.
_QUIET_DEFAULTS = ("num_groups", "track_running_stats", "layout", "residual_dtype", "norm_input")


class CaseError(ValueError):
    """A Case field holds a value outside its allowed set."""


def _fail(field: str, value: object, allowed: str) -> CaseError:
    return CaseError(f"{field}={value!r} is not allowed; allowed: {allowed}")


def _with_guess(name: str, allowed: list[str]) -> str:
    """``'epsilon' (did you mean 'eps'?)``, or the name alone when nothing allowed is close."""
    guess = difflib.get_close_matches(name, allowed, n=1)
    return f"{name!r}" + (f" (did you mean {guess[0]!r}?)" if guess else "")


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
    num_groups: int | None = None
    track_running_stats: bool | None = None
    layout: str = "contiguous"
    residual_dtype: str | None = None
    norm_input: str = "rounded"

    def __post_init__(self) -> None:
        # Lists from JSON/TOML arrive as lists; the contract value is a tuple.
        object.__setattr__(self, "shape", tuple(self.shape))
        if self.bias is None:
            # Unset bias means "the op's usual form": LN/BN carry one, RMSNorm has none.
            object.__setattr__(self, "bias", self.op in _BIAS_OPS)
        if self.track_running_stats is None:
            # BatchNorm always keeps running statistics; InstanceNorm does when asked (torch's default: not).
            object.__setattr__(self, "track_running_stats", self.op == BATCH_NORM)
        if self.param_dtype == self.dtype:
            # One spelling per meaning, so equal cases have equal ids and inputs.
            object.__setattr__(self, "param_dtype", None)
        if self.residual_dtype == self.dtype:
            object.__setattr__(self, "residual_dtype", None)
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
        for name in ("weight", "bias", "training", "track_running_stats"):
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
        if self.num_groups is not None and (
            isinstance(self.num_groups, bool) or not isinstance(self.num_groups, int)
        ):
            raise _fail("num_groups", self.num_groups, "None or a positive integer")

    def _check_names(self) -> None:
        if self.op not in OPS:
            raise _fail("op", self.op, ", ".join(OPS))
        if self.dtype not in DTYPES:
            raise _fail("dtype", self.dtype, ", ".join(DTYPES))
        if self.param_dtype is not None and self.param_dtype not in DTYPES:
            raise _fail("param_dtype", self.param_dtype, "None, " + ", ".join(DTYPES))
        if self.dist not in DISTS:
            raise _fail("dist", self.dist, ", ".join(DISTS))
        if self.layout not in LAYOUTS:
            raise _fail("layout", self.layout, ", ".join(LAYOUTS))
        if self.residual_dtype is not None and self.residual_dtype not in DTYPES:
            raise _fail("residual_dtype", self.residual_dtype, "None, " + ", ".join(DTYPES))
        if self.norm_input not in NORM_INPUTS:
            raise _fail("norm_input", self.norm_input, ", ".join(NORM_INPUTS))

    def _check_shape(self) -> None:
        if not self.shape or not all(isinstance(d, int) and d >= 1 for d in self.shape):
            raise _fail("shape", self.shape, "a non-empty tuple of positive integers")
        if self.op in _ROW_OPS and not 1 <= self.norm_ndim <= len(self.shape):
            raise _fail("norm_ndim", self.norm_ndim, f"1..{len(self.shape)} for shape {self.shape}")
        if self.op == BATCH_NORM:
            if len(self.shape) < 2:
                raise _fail("shape", self.shape, "(N, C) or (N, C, L...) for op=batch_norm")
            if self.norm_ndim != 1:
                raise _fail("norm_ndim", self.norm_ndim, "1 for op=batch_norm (channel axis is 1)")
            if self.training and self.shape[0] * math.prod(self.shape[2:]) < 2:
                # The unbiased running variance divides by count - 1.
                raise _fail("shape", self.shape, "more than one value per channel when training")
        if self.op in GROUP_OPS:
            self._check_group_shape()
        if self.layout != "contiguous" and (self.op not in CHANNEL_OPS or len(self.shape) not in (4, 5)):
            # torch's channels_last / channels_last_3d exist for (N, C, H, W) and (N, C, D, H, W) only.
            raise _fail("layout", self.layout, "contiguous, or channels_last for a 4-d or 5-d channel op")

    def _check_group_shape(self) -> None:
        minimum = 2 if self.op == GROUP_NORM else 3
        if len(self.shape) < minimum:
            allowed = "(N, C) or (N, C, spatial...)" if minimum == 2 else "(N, C, spatial...)"
            raise _fail("shape", self.shape, f"{allowed} for op={self.op}")
        if self.norm_ndim != 1:
            raise _fail("norm_ndim", self.norm_ndim, f"1 for op={self.op} (channel axis is 1)")
        if self.op == GROUP_NORM:
            channels = self.shape[1]
            if self.num_groups is None or not 1 <= self.num_groups <= channels or channels % self.num_groups:
                divisors = [g for g in range(1, channels + 1) if channels % g == 0]
                raise _fail("num_groups", self.num_groups, f"a divisor of C={channels}: {divisors}")
        elif self.uses_batch_stats and math.prod(self.shape[2:]) < 2:
            # One value per instance has no spread; torch refuses it ("more than 1 spatial element").
            raise _fail("shape", self.shape, "more than one spatial value per instance for op=instance_norm")

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
        if self.residual_dtype is not None and self.op not in ADD_OPS:
            raise _fail("residual_dtype", self.residual_dtype, f"None for op={self.op}")
        if self.norm_input != "rounded" and self.op not in ADD_OPS:
            raise _fail("norm_input", self.norm_input, f"'rounded' for op={self.op}")
        if self.num_groups is not None and self.op != GROUP_NORM:
            raise _fail("num_groups", self.num_groups, f"None for op={self.op}")
        if self.track_running_stats != (self.op == BATCH_NORM) and self.op != INSTANCE_NORM:
            raise _fail(
                "track_running_stats", self.track_running_stats, f"{self.op == 'batch_norm'} for op={self.op}"
            )
        if self.training and not self.track_running_stats:
            # Without running statistics a training step is the eval step: one spelling per meaning.
            allowed = (
                "False for op="
                + self.op
                + ("" if self.op != INSTANCE_NORM else " without track_running_stats")
            )
            raise _fail("training", self.training, allowed)
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
        if self.num_groups is not None:
            flags.append(f"g{self.num_groups}")
        if self.op == INSTANCE_NORM and self.track_running_stats and not self.training:
            flags.append("track")
        if self.training:
            flags.append(f"train-m{float(self.momentum)!r}" if self.momentum is not None else "train-mNone")
        if self.layout != "contiguous":
            flags.append("cl")
        if self.residual_dtype is not None:
            flags.append(f"r{self.residual_dtype}")
        if self.norm_input != "rounded":
            flags.append(self.norm_input)
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
            "running_stats": self.op == INSTANCE_NORM and bool(self.track_running_stats),
            "channels_last": self.layout == "channels_last",
            "residual_dtype": self.residual_dtype is not None,
            "exact_sum": self.norm_input == "exact",
        }
        return frozenset(name for name, needed in needs.items() if needed)

    def to_dict(self) -> dict[str, Any]:
        record = asdict(self)
        usual = {
            "num_groups": None,
            "track_running_stats": self.op == BATCH_NORM,
            "layout": "contiguous",
            "residual_dtype": None,
            "norm_input": "rounded",
        }
        for name in _QUIET_DEFAULTS:
            if record[name] == usual[name]:
                del record[name]
        record["shape"] = list(self.shape)
        record["id"] = self.id
        return record

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Case:
        """Build a Case from plain data (a cases file entry, a results record); ``id`` is ignored."""
        known = sorted(f.name for f in fields(cls))
        unknown = sorted(set(data) - set(known) - {"id"})
        if unknown:
            named = ", ".join(_with_guess(name, known) for name in unknown)
            raise CaseError(f"unknown Case field(s) {named}; allowed: {', '.join(known)}")
        missing = sorted(
            f.name for f in fields(cls) if f.name in {"op", "shape", "dtype", "eps"} and f.name not in data
        )
        if missing:
            raise CaseError(f"missing Case field(s) {missing}")
        return cls(**{k: v for k, v in data.items() if k != "id"})

    @property
    def stream_dtype(self) -> str:
        """Dtype of the residual stream (residual, residual_out and their gradients) of the add ops."""
        return self.residual_dtype or self.dtype

    @property
    def uses_batch_stats(self) -> bool:
        """Whether x is normalized with statistics computed from x (else with the running statistics)."""
        return self.training or not self.track_running_stats

    @property
    def groups(self) -> int:
        """Channel groups per sample of GroupNorm/InstanceNorm (InstanceNorm: one per channel); else 1."""
        if self.op == GROUP_NORM:
            return int(self.num_groups or 1)
        return self.shape[1] if self.op == INSTANCE_NORM else 1

    @property
    def rows(self) -> int:
        """Independent normalization groups (LN/RMS rows, GN/IN samples x groups); BN: values per channel."""
        if self.op == BATCH_NORM:
            return self.shape[0] * math.prod(self.shape[2:])
        if self.op in GROUP_OPS:
            return self.shape[0] * self.groups
        return math.prod(self.shape[: len(self.shape) - self.norm_ndim])

    @property
    def param_terms(self) -> int:
        """How many values each parameter-gradient element sums: rows (LN/RMS), N x spatial (channel ops)."""
        if self.op in CHANNEL_OPS:
            return self.shape[0] * math.prod(self.shape[2:])
        return self.rows

    @property
    def param_shape(self) -> tuple[int, ...]:
        if self.op in CHANNEL_OPS:
            return (self.shape[1],)
        return self.shape[len(self.shape) - self.norm_ndim :]
