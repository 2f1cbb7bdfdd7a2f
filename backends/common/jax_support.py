"""Shared plumbing of the JAX adapters (Flax linen, Keras on JAX): x64 mode, NumPy<->JAX copies (bfloat16
through ml_dtypes, which JAX uses natively), the device and its name, versions, the fused ops' residual
sum, and the device buffers the aliasing check reads.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from importlib import metadata
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from backends.common.host import cpu_name
from conformance.model.dtypes import numpy_dtype

# JAX's platform names -> the contract's device names (Capabilities.device).
_DEVICES = {"cpu": "cpu", "gpu": "cuda", "cuda": "cuda", "rocm": "rocm", "tpu": "tpu"}


def enable_x64() -> None:
    """Turn on JAX's 64-bit mode (idempotent); call before any array is made.

    Without it JAX canonicalizes every float64 request to float32: ``jnp.asarray`` of a float64
    array silently returns float32 and a module's ``dtype=float64`` computes in float32, so a float64
    case would run (and pass or fail) as a float32 one. With it, float32/float16/bfloat16 arrays keep
    their dtypes and Python scalars stay weakly typed, so the narrower cases compute as before.
    """
    config: Any = jax.config  # untyped in jax's stubs
    if not config.read("jax_enable_x64"):
        config.update("jax_enable_x64", True)


def jax_dtype(name: str) -> np.dtype[Any]:
    """The dtype JAX uses for a contract dtype name (bfloat16 is ml_dtypes.bfloat16 in both)."""
    return numpy_dtype(name)


def to_jax(array: np.ndarray, dtype: str | None = None) -> jax.Array:
    """A device copy of ``array`` (optionally converted to ``dtype``); never shares the caller's memory.

    The host copy comes first: on the CPU ``jax.device_put`` may alias a suitably aligned NumPy buffer.
    """
    host = np.array(array, dtype=None if dtype is None else jax_dtype(dtype), copy=True, order="C")
    value: jax.Array = jax.device_put(host, device())
    if value.dtype != host.dtype:
        raise RuntimeError(f"JAX turned {host.dtype} into {value.dtype}: is x64 mode on (enable_x64)?")
    return value


def to_numpy(value: jax.Array, dtype: str | None = None) -> np.ndarray:
    """A host copy of ``value`` (bfloat16 as ml_dtypes.bfloat16), optionally rounded to ``dtype``."""
    host = np.array(value, copy=True)
    return host if dtype is None else host.astype(jax_dtype(dtype))


def device() -> Any:
    """The device JAX runs on by default (its first device: the accelerator when there is one)."""
    return jax.devices()[0]


def device_type() -> str:
    """The contract's device name for JAX's default platform."""
    return _DEVICES.get(jax.default_backend(), jax.default_backend())


def device_name() -> str:
    """The CPU's brand string, or the accelerator's kind as JAX reports it (e.g. "NVIDIA H200")."""
    return cpu_name() if device_type() == "cpu" else str(device().device_kind)


def block(tree: Any) -> Any:
    """Wait until every array of ``tree`` is computed (JAX dispatches asynchronously)."""
    wait: Any = jax.block_until_ready  # untyped in jax's stubs
    return wait(tree)


def versions() -> dict[str, str]:
    """Versions of the JAX stack, for Capabilities.notes."""
    # jaxlib is the compiled half; its version can differ from jax's.
    return {
        "jax": jax.__version__,
        "jaxlib": metadata.version("jaxlib"),
        "jax_backend": jax.default_backend(),
    }


def residual_sum(
    x: jax.Array, residual: jax.Array, stream: str, *, exact: bool
) -> tuple[jax.Array, jax.Array]:
    """(residual_out, what the norm reads) of h = x + residual, as a JAX user spells each convention.

    Rounded: h in the stream's dtype (x upcast first under a float32 stream, which is JAX's own promotion
    of bfloat16 + float32 spelled out), stored and normalized alike. Exact: the sum in at least float32,
    normalized as it is, with only the stored copy rounded to the stream's dtype.
    """
    if not exact:
        total = x.astype(jax_dtype(stream)) + residual
        return total, total
    wide = jax_dtype(promote(stream, "float32"))
    total = x.astype(wide) + residual.astype(wide)
    return total.astype(jax_dtype(stream)), total


def buffers(inputs: Mapping[str, jax.Array], outputs: Mapping[str, Any]) -> dict[str, tuple[int, int]]:
    """``Prepared.buffers()`` of a JAX adapter: (address, nbytes) of each named device array.

    A name that is both an input and an output (BatchNorm training's running statistics: the prepared
    statistics in, new arrays out) is left out, since one name can place only one buffer; the check
    then reads that output from outputs() and the other buffers from here.
    """
    both = inputs.keys() & outputs.keys()
    named = {**inputs, **outputs}
    return {
        name: (int(a.unsafe_buffer_pointer()), int(a.nbytes)) for name, a in named.items() if name not in both
    }


def promote(*dtypes: str) -> str:
    """The contract name of JAX's promotion of ``dtypes`` (as jnp.promote_types computes it)."""
    result = jax_dtype(dtypes[0])
    for name in dtypes[1:]:
        result = jnp.promote_types(result, jax_dtype(name))
    return str(np.dtype(result).name)


@dataclass(frozen=True)
class Compiled:
    """A compiled XLA executable and how long tracing, lowering and compiling it took."""

    executable: Any
    compile_s: float


class Executables:
    """Compiled executables by key (everything the compiled function depends on besides values),
    least recently used dropped past ``size``: cases that differ only in values share one."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._entries: OrderedDict[Hashable, Compiled] = OrderedDict()

    def get(self, key: Hashable, compile: Callable[[], Any]) -> tuple[Compiled, bool]:
        """(the executable for ``key``, whether it was cached); ``compile`` runs, timed, on a miss."""
        hit = key in self._entries
        if hit:
            self._entries.move_to_end(key)
        else:
            start = time.perf_counter()
            self._entries[key] = Compiled(compile(), time.perf_counter() - start)
            while len(self._entries) > self._size:
                self._entries.popitem(last=False)
        return self._entries[key], hit
