"""How the Triton kernels run here: natively on a GPU, or under the Triton interpreter on the CPU.

``select()`` decides once per process and, on a machine without a CUDA device, sets
``TRITON_INTERPRET=1`` before this package imports Triton (Triton reads it when a kernel is
decorated). If another library imported Triton first, the kernels still run interpreted: they call
only Triton builtins, never its @jit library functions (see ``common.add_up``).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from dataclasses import dataclass
from functools import cache

INTERPRET = "TRITON_INTERPRET"
# Modules of this package that import Triton (and so decorate kernels when imported).
KERNEL_MODULES = tuple(
    f"backends.triton.kernels.{name}"
    for name in (
        "common",
        "layer_norm",
        "rms_norm",
        "group_norm",
        "reduce",
        "launch",
        "add_functions",
        "functions",
    )
)


# Set by compile_only(): the process compiles kernels for named GPU targets (triton_kernels.aot) and
# launches none; the autograd wrappers run on meta tensors so that their launches can be recorded.
_COMPILE_ONLY = False


class ModeUnavailable(RuntimeError):
    """Neither a native nor an interpreted Triton run is possible here; carries the reason."""


@dataclass(frozen=True)
class Mode:
    """The chosen way to run: ``interpreted`` kernels take CPU tensors, native ones the CUDA device."""

    interpreted: bool
    device: str
    why: str

    @property
    def name(self) -> str:
        return "interpreted" if self.interpreted else "native"

    @property
    def compile_only(self) -> bool:
        return self.device == "meta"


def _env_forced() -> bool:
    return os.environ.get(INTERPRET, "0").strip().lower() in ("1", "true", "on", "yes")


@cache
def select() -> Mode:
    """The run mode of this process; raises ModeUnavailable with the reason when there is none."""
    if importlib.util.find_spec("triton") is None:
        raise ModeUnavailable("triton is not installed (pip install 'normconf[triton]')")
    if _COMPILE_ONLY:
        return Mode(False, "meta", "ahead-of-time compilation for named GPU targets: nothing is launched")
    import torch

    if _env_forced():
        return Mode(True, "cpu", f"{INTERPRET}=1 was set by the caller: kernels run as NumPy on the CPU")
    if not torch.cuda.is_available():
        _require_undecorated()
        os.environ[INTERPRET] = "1"
        return Mode(True, "cpu", f"no CUDA device: {INTERPRET}=1 set, kernels run as NumPy on the CPU")
    return _native(torch.cuda.get_device_name())


def compile_only() -> Mode:
    """Choose ahead-of-time compilation for this process (backends.triton.kernels.aot): the kernels are
    decorated for a GPU, as on a CUDA machine, but only compiled for the targets named, on any machine.
    Must come before any other choice of mode, with the interpreter off."""
    global _COMPILE_ONLY
    if select.cache_info().currsize and not select().compile_only:
        raise ModeUnavailable(
            f"the run mode was already chosen ({select().name}): choose ahead-of-time compilation "
            f"before anything calls backends.triton.kernels.mode.select()"
        )
    if _env_forced():
        raise ModeUnavailable(
            f"{INTERPRET}=1 is set: the kernels would be decorated for the interpreter, which compiles "
            f"nothing for a GPU; unset it for ahead-of-time compilation"
        )
    _COMPILE_ONLY = True
    select.cache_clear()
    return select()


def _require_undecorated() -> None:
    """Kernels decorated before the interpreter was switched on would need a GPU this machine lacks."""
    early = [name for name in KERNEL_MODULES if name in sys.modules]
    if early:
        raise ModeUnavailable(
            f"{early[0]} was imported before backends.triton.kernels.mode.select(), so its kernels were "
            f"compiled for a GPU; this machine has none. Set {INTERPRET}=1 before starting Python"
        )


def _native(gpu: str) -> Mode:
    try:
        import triton

        target = triton.runtime.driver.active.get_current_target()
    except Exception as exc:  # any failure to reach the driver means no native run
        raise ModeUnavailable(
            f"CUDA device {gpu} is present but Triton cannot target it ({type(exc).__name__}: {exc}); "
            f"set {INTERPRET}=1 to run the kernels interpreted on the CPU"
        ) from exc
    return Mode(False, "cuda", f"native on {gpu} ({target.backend} {target.arch})")


def require_selected() -> None:
    """Called by the kernel modules at import: the mode must be chosen before any kernel exists."""
    if not select.cache_info().currsize:
        raise ModeUnavailable(
            "import backends.triton.kernels.mode and call select() before importing the kernels, so "
            "that the Triton interpreter can be switched on first on a machine without a GPU"
        )
