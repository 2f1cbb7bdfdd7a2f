"""keras (Keras 3 on torch) and keras-jax (the same layers on Keras' JAX backend): keras.layers
LayerNormalization, RMSNormalization, BatchNormalization and GroupNormalization (GroupNorm, and
InstanceNorm as groups=-1) under a dtype policy matching the case; the fused residual ops as
keras.ops.add in front of LayerNormalization / RMSNormalization.

Keras picks its backend once per process; the adapter of this process's backend runs in process, the
other in a persistent child process (backends/keras/child.py). The translation (backends/keras/plan.py)
is computed here either way: momentum 1 - m, the channel axis, the trailing axes, center/scale, the
dtype policy, Gemma's offset, GroupNormalization's groups.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import weakref
from collections.abc import Mapping
from importlib import metadata
from typing import Any

import numpy as np

from backends.keras import plan as _keras_plan
from backends.keras.child import Handle, Worker
from backends.keras.plan import Plan
from conformance.adapter.backend import (
    FEATURES,
    BackendUnavailable,
    Capabilities,
    Inputs,
    Outputs,
    Prepared,
)
from conformance.model.case import ADD_RMS_NORM, BATCH_NORM, GROUP_NORM, INSTANCE_NORM, Case
from conformance.model.dtypes import DTYPES

OPS = frozenset(
    {"layer_norm", "rms_norm", "batch_norm", "add_rms_norm", "add_layer_norm", "group_norm", "instance_norm"}
)
# Not declared: Keras' BatchNormalization has no cumulative average; Keras has no InstanceNorm with
# running statistics; channels_last is a torch memory format, not a Keras layer option.
UNDECLARED = frozenset({"momentum_none", "running_stats", "channels_last"})
# The extra that installs each library an adapter needs.
_EXTRAS = {"keras": "keras", "torch": "keras", "jax": "flax"}
NOTES: dict[str, str] = {
    "momentum": "translated: Keras keeps momentum of the old moving value, so it gets 1 - m",
    "momentum_none": "not declared: Keras' BatchNormalization has no cumulative average, one fixed momentum",
    "running_var": "Keras updates moving_variance with the biased batch variance (PyTorch: unbiased); no"
    " exact translation (the same momentum also weights the mean), so training running_var deviates",
    "param_dtype": "a DTypePolicy: compute dtype = activations, variable dtype = parameters; only"
    " mixed_float16 / mixed_bfloat16 pair two dtypes (others: Unsupported). On the torch backend"
    " RMSNormalization's float32 scale is autocast to the half compute dtype (dweight rounded to it, a"
    " known deviation); JAX's stateless_call keeps it float32",
    "weight_offset": "translated (RMSNormalization has no offset): scale = offset + w, only where that is"
    " exact in the parameter dtype, the dtype Keras holds and applies it in (else Unsupported)",
    "no_weight": "LN/BN: scale=False; RMSNormalization always has a scale: ones, not differentiated",
    "multi_axis": "LayerNormalization/RMSNormalization(axis=[-2, -1]); BatchNormalization(axis=1)",
    "statistics": "in float32 (Keras upcasts half inputs); BatchNormalization's batch variance is one-pass"
    " E[x^2] - E[x]^2 on the torch backend (keras.ops.moments), two-pass on JAX, where"
    " ops.batch_normalization folds y = x * inv + (beta - mean * inv); see the fingerprint",
    GROUP_NORM: "GroupNormalization(groups=G, axis=1): channels-first as the case gives it (no"
    " transpose); statistics in float32 (ops.moments: one-pass E[x^2] - E[x]^2 on the torch backend,"
    " two-pass jnp.var on JAX), eps inside rsqrt, folded y = x * inv + (beta - mean * inv)",
    INSTANCE_NORM: "GroupNormalization(groups=-1, axis=1), Keras' spelling of InstanceNorm: each"
    " instance's own statistics; running_stats is not declared (Keras keeps none for it)",
    "channels_last": "not declared: a torch memory format; Keras layers take the array as given",
    "float64": "computed in float32: keras.backend.result_type maps float64 to float32 on the torch and"
    " JAX backends, so the layers cast float64 inputs down and the results back up (a known deviation)",
    ADD_RMS_NORM: "h = keras.ops.add(x, residual) in the residual stream's dtype, then the layer on h"
    " (add_layer_norm: LayerNormalization), residual_out = h; backward through both outputs (cotangents"
    " dy and dresidual_out; torch autograd / jax.vjp wrt x, residual and the variables). On JAX, XLA's"
    " default allow_excess_precision skips the rounding of a bfloat16 sum inside the jitted step (a"
    " deviation: see the fingerprint's add_*.sum)",
    "residual_dtype": "residual in float32: h = ops.add(ops.cast(x, 'float32'), residual) is residual_out and"
    " the layer's input. LayerNormalization opts out of autocast: under the case's policy it normalizes"
    " a float32 input in float32 and rounds only y to the compute dtype, so it reads h as it is.",
    "rms_autocast": "RMSNormalization autocasts its input to the compute dtype, so under a bfloat16/"
    "float16 policy it would normalize h rounded to the activation dtype; where it must read a float32"
    " sum it runs under the 'float32' policy (Keras' mixed-precision idiom for a sensitive layer;"
    " parameters held exactly in float32 variables, gradients rounded once to the parameter dtype) and"
    " y is cast to the activation dtype after it",
    "exact_sum": "norm_input exact: h32 = ops.add(ops.cast(x, w), ops.cast(residual, w)), w at least"
    " float32; residual_out = ops.cast(h32, stream dtype); the layer reads h32 (see rms_autocast)",
    "buffers": "buffers(): keras (torch) reports its tensors, keras-jax its device buffers (address,"
    " nbytes) (in process only; a child process's outputs come back as host copies); BatchNorm's moving"
    " statistics, Keras variables updated in place by design and reset at every call, are left out",
}
# On the torch backend autograd hands dL/dh to x and residual as ONE tensor when h = x + residual adds
# in one dtype (AddBackward passes its gradient through): dx and dresidual share memory by design.
TORCH_ALIASES: dict[str, str] = {"dresidual": "dx"}
# The benchmarks leave out a backend whose Capabilities.notes["mode"] starts with "interpreted"
# (conformance/bench/measure.py): its time means nothing there. A call of an out-of-process adapter
# is a pickled request and reply over a socket around the run, so the same holds; the note says why.
_CHILD_MODE = (
    "interpreted-like timing (out of process): {why}, so Keras on {there} runs in a child process"
    " (KERAS_BACKEND={there}); each call's time includes the inter-process round trip, so the"
    " benchmarks leave it out (--bench-interpreted times it anyway)"
)


def process_backend(wanted: str) -> str:
    """The Keras backend of this process, claimed for ``wanted`` while still open.

    Keras 3 fixes its backend when keras is first imported, from KERAS_BACKEND (else
    ~/.keras/keras.json, else tensorflow, which normconf does not install: the import fails). While
    keras is not imported and the variable is unset, the first adapter to ask sets it for its own
    backend, so that adapter runs in this process and only the other one needs a child process.
    """
    keras = sys.modules.get("keras")
    if keras is not None:
        return str(keras.config.backend())
    current = os.environ.get("KERAS_BACKEND", "").strip()
    if current:
        return current
    os.environ["KERAS_BACKEND"] = wanted
    return wanted


def _version(distribution: str) -> str:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "not installed"


def _ops() -> frozenset[str]:
    """RMSNormalization arrived in Keras 3.9; older Keras runs LayerNorm and BatchNorm only."""
    major, minor = (int(part) for part in _version("keras").split(".")[:2])
    return OPS if (major, minor) >= (3, 9) else OPS - {"rms_norm", "add_rms_norm"}


def _arrays(inputs: Inputs, grad: bool) -> dict[str, np.ndarray]:
    """Copies of what the run reads besides the plan's variables (x, residual, dy, dresidual_out)."""
    names = ("x", "residual", "dy", "dresidual_out") if grad else ("x", "residual")
    return {name: np.array(inputs[name], copy=True) for name in names if name in inputs}


class _ChildPrepared:
    """A case prepared in the child process; each call is one request and reply over the socket."""

    def __init__(self, worker: Worker, handle: Handle, info: Mapping[str, Any]) -> None:
        self._worker = worker
        self._handle = handle
        self._info = dict(info)
        weakref.finalize(self, worker.release, handle)

    def __call__(self) -> None:
        self._worker.request(self._handle, "run")

    def synchronize(self) -> None:
        pass  # the child synchronizes before it replies to "run"

    def outputs(self) -> Outputs:
        outputs: Outputs = self._worker.request(self._handle, "outputs")
        return outputs

    def info(self) -> dict[str, Any]:
        return {
            **self._info,
            "timing": "includes the inter-process round trip (the run happens in a child process)",
        }


class _KerasLayers:
    """keras.layers on one Keras backend; subclasses name it."""

    name: str
    keras_backend: str
    library: str  # the distribution of the backend's library (for availability and versions)
    aliases: Mapping[str, str] = {}  # Capabilities.aliases: outputs that share memory by design
    # Run in a child process even where this process could run it (the tests of the child path).
    always_child: bool = False

    def __init__(self) -> None:
        self._worker: Worker | None = None

    def runs_here(self) -> bool:
        """Whether this adapter's cases run in this process (else in its child process)."""
        return not self.always_child and process_backend(self.keras_backend) == self.keras_backend

    def capabilities(self) -> Capabilities:
        missing = [lib for lib in ("keras", self.library) if importlib.util.find_spec(lib) is None]
        if missing:
            extras = ",".join(dict.fromkeys(_EXTRAS[lib] for lib in missing))
            raise BackendUnavailable(
                f"needs {' and '.join(missing)}, which is not installed (pip install 'normconf[{extras}]')"
            )
        here = self.runs_here()
        notes = {
            "keras": _version("keras"),
            self.library: _version(self.library),
            "keras_backend": self.keras_backend,
            "process": "this process" if here else "a child process",
            **NOTES,
        }
        if not here:
            here_is = f"this process's Keras backend is {process_backend(self.keras_backend)}"
            why = "always_child is set" if self.always_child else here_is
            notes["mode"] = _CHILD_MODE.format(why=why, there=self.keras_backend)
        device, device_name = self.device()
        return Capabilities(
            ops=_ops(),
            dtypes=frozenset(DTYPES),
            features=frozenset(FEATURES) - UNDECLARED,
            device=device,
            device_name=device_name,
            notes=notes,
            aliases=dict(self.aliases),
        )

    def device(self) -> tuple[str, str]:
        raise NotImplementedError

    def keras_momentum(self, case: Case) -> float | None:
        """BatchNormalization's Keras momentum (1 - m; see _keras_plan.keras_momentum)."""
        if case.op != BATCH_NORM:
            return None
        return _keras_plan.keras_momentum(case.momentum)

    def plan(self, case: Case, inputs: Inputs, *, default_eps: bool = False) -> Plan:
        return _keras_plan.plan(case, inputs, self.keras_momentum(case), default_eps=default_eps)

    def prepare(self, case: Case, inputs: Inputs, *, grad: bool) -> Prepared:
        return self._prepare(self.plan(case, inputs), _arrays(inputs, grad), grad)

    def prepare_default_eps(self, case: Case, inputs: Inputs) -> Prepared:
        """The fingerprint's hook: the layer built without epsilon (Keras' own default applies)."""
        return self._prepare(self.plan(case, inputs, default_eps=True), _arrays(inputs, False), False)

    def close(self) -> None:
        """End this adapter's child process, if it started one (also done at exit and on collection)."""
        if self._worker is not None:
            self._worker.close()

    def _prepare(self, plan: Plan, arrays: Mapping[str, np.ndarray], grad: bool) -> Prepared:
        if self.runs_here():
            from backends.keras import run as _keras_run  # imports keras, on this process's backend

            return _keras_run.runner(plan, arrays, grad)
        if self._worker is None:
            self._worker = Worker(self.keras_backend)
        handle, info = self._worker.prepare(plan, arrays, grad)
        return _ChildPrepared(self._worker, handle, info)


class KerasTorch(_KerasLayers):
    """Keras 3 on its torch backend (CUDA when torch has it), eager, torch autograd for gradients."""

    name = "keras"
    keras_backend = "torch"
    library = "torch"
    aliases = TORCH_ALIASES

    def device(self) -> tuple[str, str]:
        from backends.common import torch_support as tc

        dev = tc.device()
        return dev.type, tc.device_name(dev)

    def copy_kernel(self, nbytes: int) -> Prepared:
        from backends.common import torch_support as tc

        return tc.copy_kernel(nbytes)


class KerasJax(_KerasLayers):
    """Keras 3 on its JAX backend: stateless_call under jax.jit, jax.vjp for gradients."""

    name = "keras-jax"
    keras_backend = "jax"
    library = "jax"

    def device(self) -> tuple[str, str]:
        from backends.common import jax_support as jc

        return jc.device_type(), jc.device_name()
