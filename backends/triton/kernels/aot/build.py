"""Compile a recorded launch for a target, as Triton's JIT would compile it on that GPU, and judge the
result: resources, theoretical occupancy, vectorized global accesses.

The specialization is what ``JITFunction.run`` computes at a launch: Triton's binder over the recorded
arguments (types, integer arguments divisible by 16, aligned pointers; on AMD, pointer ranges under
2 GiB), then ``_pack_args`` into signature, constexprs and attributes, compiled with
``triton.compile(ASTSource(...), target=GPUTarget(...))``. Those are Triton internals (3.9): if they
change, ``specialize`` fails with the Triton version in the message rather than compiling something
else.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import importlib.util
import io
import math
import traceback
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import triton
from triton import knobs
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, make_backend
from triton.runtime.jit import create_function_from_signature

from backends.triton.kernels import mode
from backends.triton.kernels.aot import resources, targets
from backends.triton.kernels.aot.launches import Arg, Launch

# The kernels that stream rows (or channel rows, or partial rows) of contiguous memory, and the
# integer argument that is their row length: when it is a multiple of 16 and a thread holds at least
# 128 bits of a row, the row's loads and stores must be 128 bits wide (register_row_kernel adds one).
ROW_LENGTH = {
    "layer_norm_fwd": "n_cols",
    "layer_norm_bwd": "n_cols",
    "rms_norm_fwd": "n_cols",
    "rms_norm_bwd": "n_cols",
    "group_norm_fwd": "n_cols",
    "group_norm_dx": "n_cols",
    "channel_sums": "spatial",
    "column_sum": "n_cols",
}
# The modules whose row tile accesses tile_lines() finds.
TILE_MODULES: list[str] = list(mode.KERNEL_MODULES)
# The widest access a thread makes in one instruction on either vendor's global memory path.
VECTOR_BITS = 128


@dataclass(frozen=True)
class Specialization:
    """What one compiled kernel is specialized on, for one target."""

    kernel: str
    signature: dict[str, str]
    constexprs: dict[str, Any]
    aligned: tuple[str, ...]  # arguments Triton knows are multiples of 16 (pointers: 16-byte aligned)
    ranged: tuple[str, ...]  # AMD: pointers whose tensors span under 2 GiB (buffer instructions)
    warps: int
    max_registers: int | None  # NVIDIA: the launch's maxnreg

    @property
    def key(self) -> str:
        """Stable text naming the specialization (tables, deduplication)."""
        types = " ".join(f"{k}:{v}" for k, v in self.signature.items() if v != "constexpr")
        consts = ", ".join(f"{k}={_text(v)}" for k, v in self.constexprs.items())
        attrs = f"aligned {','.join(self.aligned)}" + (
            f"; ranged {','.join(self.ranged)}" if self.ranged else ""
        )
        bound = "" if self.max_registers is None else f", maxnreg={self.max_registers}"
        return f"{self.kernel}({types}; {consts}; {attrs}; warps={self.warps}{bound})"

    @property
    def short(self) -> str:
        """The launch shape and flags, for a table cell."""
        shape = "x".join(str(self.constexprs[k]) for k in ("BLOCK_M", "BLOCK_N") if k in self.constexprs)
        flags = [k.lower() for k, v in self.constexprs.items() if v is True and k != "ONE_CHUNK"]
        chunks = "" if self.constexprs.get("ONE_CHUNK", True) else " chunked"
        first = next(iter(self.signature.values()))
        return f"{first[1:]} {shape}{chunks} w{self.warps}" + (f" [{' '.join(flags)}]" if flags else "")


def _text(value: Any) -> str:
    return str(getattr(value, "name", value))


def gpu_target(target: targets.Target) -> Any:
    return GPUTarget(target.backend, target.arch, target.warp_size)


def _run_kwargs(kernel: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    # The options JITFunction.run adds to a launch's keyword arguments before binding them.
    return {
        **kwargs,
        "debug": kwargs.get("debug", kernel.debug) or knobs.runtime.debug,
        "instrumentation_mode": knobs.compilation.instrumentation_mode,
        "fpsan_homomorphic_casts": knobs.compilation.fpsan_homomorphic_casts,
    }


@functools.cache
def _binder(kernel: Any, target: targets.Target) -> tuple[Any, Any]:
    backend = make_backend(gpu_target(target))
    return backend, create_function_from_signature(kernel.signature, kernel.params, backend)


def specialize(launch: Launch, target: targets.Target) -> tuple[Specialization, Any, Any]:
    """(the specialization, Triton's ASTSource, its options) of ``launch`` on ``target``."""
    kernel = launch.kernel
    try:
        backend, binder = _binder(kernel, target)
        kwargs = _run_kwargs(kernel, launch.kwargs)
        bound, spec, options = binder(*launch.args, **kwargs)
        options, signature, constexprs, attrs = kernel._pack_args(backend, kwargs, bound, spec, options)
    except (AttributeError, TypeError) as exc:
        raise RuntimeError(
            f"Triton {triton.__version__}'s JIT internals differ from those this module reads "
            f"(create_function_from_signature, JITFunction._pack_args): {type(exc).__name__}: {exc}"
        ) from exc
    names = list(signature)
    aligned = tuple(names[path[0]] for path, attr in attrs.items() if ["tt.divisibility", 16] in attr)
    ranged = tuple(names[path[0]] for path, attr in attrs.items() if ["tt.pointer_range", 32] in attr)
    known = {"tt.divisibility", "tt.pointer_range"}
    other = [a for attr in attrs.values() for a in attr if a[0] not in known]
    if other:
        # A specialization this module does not name would be compiled once for launches that differ.
        raise RuntimeError(f"Triton {triton.__version__} specializes on attributes not named here: {other}")
    consts = {names[path[0]]: value for path, value in constexprs.items()}
    bound = getattr(options, "maxnreg", None)
    found = Specialization(launch.name, dict(signature), consts, aligned, ranged, options.num_warps, bound)
    return found, ASTSource(kernel, signature, constexprs, attrs), options


@dataclass(frozen=True)
class Compiled:
    """One specialization compiled for one target, with what it uses and what is wrong with it."""

    target: str
    spec: Specialization
    used: resources.Resources | None
    accesses: resources.Accesses | None
    occupancy: targets.Occupancy | None
    vector_bits: int  # the width the row accesses must reach (0: not expected, see expected_bits)
    problems: tuple[str, ...] = field(default=())

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def vectorized(self) -> bool | None:
        """None where no width is expected (or nothing was compiled); else whether row tile accesses
        were found and every one reaches it."""
        if not self.vector_bits or self.accesses is None:
            return None
        tiles = tile_accesses(self.accesses)
        return bool(tiles) and all(a.bits >= self.vector_bits for a in tiles)


def compile_launch(launch: Launch, target: targets.Target) -> Compiled:
    """Compile ``launch`` for ``target``; a compile error becomes a problem of this one result."""
    spec, source, options = specialize(launch, target)
    try:
        kernel, log = _compile(source, options, target)
    except Exception as exc:  # any compiler failure is this specialization's failure, reported
        last = traceback.format_exception_only(exc)[-1].strip()
        return Compiled(target.name, spec, None, None, None, 0, (f"compile error: {last[:2000]}",))
    meta = kernel.metadata
    scratch = int(getattr(meta, "global_scratch_size", 0) or 0)
    shared = int(meta.shared or 0)
    try:
        if target.vendor == "nvidia":
            used = resources.nvidia(log, shared, scratch)
            accesses = resources.ptx_accesses(kernel.asm["ptx"])
        else:
            used = resources.amd(kernel.asm["amdgcn"], shared, scratch)
            accesses = resources.amdgcn_accesses(kernel.asm["amdgcn"])
    except resources.UnreadableOutput as exc:
        return Compiled(target.name, spec, None, None, None, 0, (f"unreadable compiler output: {exc}",))
    occ = targets.occupancy(target, spec.warps, used.registers, used.shared, used.sgprs)
    bits = expected_bits(launch, spec, target)
    return Compiled(target.name, spec, used, accesses, occ, bits, problems(target, used, occ, accesses, bits))


def _compile(source: Any, options: Any, target: targets.Target) -> tuple[Any, str]:
    """The compiled kernel and ptxas's report (NVIDIA; empty for AMD). Triton prints that report when
    asked and only when ptxas runs, so the cache is bypassed for this compile."""
    out = io.StringIO()
    with (
        knobs.nvidia.scope(),
        knobs.compilation.scope(),
        contextlib.redirect_stdout(out),
        warnings.catch_warnings(),
    ):
        knobs.nvidia.dump_ptxas_log = True
        knobs.compilation.always_compile = True
        # Triton 3.9 warns that the FMA-fusion default will change; the launches keep the default.
        warnings.filterwarnings("ignore", message="TRITON_DEFAULT_FP_FUSION")
        kernel = triton.compile(source, target=gpu_target(target), options=options.__dict__)
    return kernel, out.getvalue() if target.vendor == "nvidia" else ""


def expected_bits(launch: Launch, spec: Specialization, target: targets.Target) -> int:
    """The width a row kernel's tile accesses must reach: 128 bits when the launch's row length is a
    multiple of 16 (every row then starts 16-byte aligned, and Triton's JIT specializes on exactly
    that) and each thread holds at least 128 bits of the tile in the narrowest dtype it moves; 0 where
    nothing is expected (other kernels, other row lengths, tiles too small). Taken from the launch's
    values, not from the compiled specialization, so a kernel that opts out of that specialization
    (``do_not_specialize``) is expected to vectorize all the same, and fails."""
    length = ROW_LENGTH.get(spec.kernel)
    if length is None:
        return 0
    values = dict(zip(launch.kernel.arg_names, launch.args, strict=False))
    if int(values[length]) % 16:
        return 0
    block = spec.constexprs.get("BLOCK_M", 1) * spec.constexprs["BLOCK_N"]
    narrowest = min(int(a.dtype.itemsize) * 8 for a in launch.args if isinstance(a, Arg))
    per_thread = block // (spec.warps * target.warp_size) * narrowest
    return VECTOR_BITS if per_thread >= VECTOR_BITS else 0


def register_row_kernel(kernel: str, row_length: str, module: str) -> None:
    """Judge ``kernel``'s vectorization too: ``row_length`` names its row length argument, ``module``
    (importable) holds its source."""
    ROW_LENGTH[kernel] = row_length
    if module not in TILE_MODULES:
        TILE_MODULES.append(module)


def tile_lines() -> frozenset[tuple[str, int]]:
    return _tile_lines(tuple(TILE_MODULES))


@functools.cache
def _tile_lines(modules: tuple[str, ...]) -> frozenset[tuple[str, int]]:
    """(file name, line) of every ``tl.load`` / ``tl.store`` in the kernel modules whose pointer is a
    row tile's: its expression uses ``offsets`` or ``base`` (the kernels' names for a tile's element
    offsets and its rows' starts). Parameter loads (``P + cols``), per-row statistics, the partial
    rows and GroupNorm's per-element channel gathers are not row tiles."""
    found = set()
    for name in modules:
        spec = importlib.util.find_spec(name)
        if spec is None or spec.origin is None:
            continue
        path = Path(spec.origin)
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args):
                continue
            if not (isinstance(node.func.value, ast.Name) and node.func.value.id == "tl"):
                continue
            if node.func.attr in ("load", "store"):
                names = {n.id for n in ast.walk(node.args[0]) if isinstance(n, ast.Name)}
                if names & {"offsets", "base"}:
                    found.add((path.name, node.lineno))
    return frozenset(found)


def tile_accesses(accesses: resources.Accesses) -> list[resources.Access]:
    lines = tile_lines()
    return [a for a in accesses.items if (a.file, a.line) in lines]


def problems(
    target: targets.Target,
    used: resources.Resources,
    occ: targets.Occupancy,
    accesses: resources.Accesses,
    bits: int,
) -> tuple[str, ...]:
    """What fails the check: spills, shared memory over the target's limit (or no block fitting at all),
    row tile accesses narrower than expected."""
    found = []
    if used.spills:
        unit = "bytes" if target.vendor == "nvidia" else "registers"
        found.append(f"spills: {used.spills} {unit} per thread")
    if used.shared > target.shared_per_block:
        found.append(f"shared memory {used.shared} B over the {target.shared_per_block} B a block may have")
    elif occ.blocks == 0:
        found.append(f"no block fits on one multiprocessor (limited by {occ.limiter})")
    if bits:
        tiles = tile_accesses(accesses)
        if not tiles:
            found.append("no row tile access found in the line info: cannot judge vectorization")
        narrow = sorted({(a.file, a.line, a.kind, a.bits) for a in tiles if a.bits < bits})
        for file, line, kind, width in narrow:
            found.append(f"{file}:{line}: {kind} of {width} bits per thread, not vectorized to {bits}")
    return tuple(found)


def occupancy_percent(c: Compiled) -> float:
    return math.nan if c.occupancy is None else 100.0 * c.occupancy.fraction
