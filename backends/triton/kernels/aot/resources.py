"""What a compiled kernel uses, read from the compiler's own output, and its global memory accesses by
width. Pure text parsing (no Triton import), so every rule is unit-tested on small excerpts.

NVIDIA: ptxas's verbose report for the cubin ("Used N registers", "N bytes stack frame, N bytes spill
stores, N bytes spill loads", "N bytes smem" when there is static shared memory) and the PTX's
``ld.global`` / ``st.global`` instructions. AMD: the code object's metadata in the AMDGCN listing
(``.vgpr_count``, which on gfx90a and later counts the unified file, accumulation registers included;
``.sgpr_count``, ``.vgpr_spill_count``, ``.sgpr_spill_count``, ``.group_segment_fixed_size``,
``.private_segment_fixed_size``), LLVM's own occupancy remark, and the ``global_`` / ``buffer_`` load
and store instructions.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Resources:
    """Per-thread (per-lane) and per-block resources of one compiled kernel."""

    registers: int  # NVIDIA: 32-bit registers per thread; AMD: unified vector registers per lane
    spills: int  # NVIDIA: bytes of spill stores + loads per thread; AMD: registers spilled (VGPR + SGPR)
    shared: int  # bytes of shared memory (LDS) per block: static + what Triton allocates
    scratch: int  # bytes of per-thread local/private memory (stack frame, scratch) + Triton's global scratch
    sgprs: int = 0  # AMD: scalar registers per wave
    stated_waves: int | None = None  # AMD: LLVM's own waves-per-SIMD remark, for a cross-check

    def as_dict(self) -> dict[str, int | None]:
        return {
            "registers": self.registers,
            "spills": self.spills,
            "shared": self.shared,
            "scratch": self.scratch,
            "sgprs": self.sgprs,
            "stated_waves": self.stated_waves,
        }


class UnreadableOutput(ValueError):
    """The compiler's output lacks a figure this module reads: a changed format, never a zero."""


def _one(pattern: str, text: str, what: str) -> int:
    found = re.findall(pattern, text, re.MULTILINE)
    if len(found) != 1:
        raise UnreadableOutput(f"{what}: expected one match of {pattern!r}, found {len(found)}")
    return int(found[0])


def nvidia(ptxas_log: str, dynamic_shared: int, global_scratch: int) -> Resources:
    """From ptxas -v's report on one kernel, and what Triton's metadata says it allocates itself."""
    registers = _one(r"Used (\d+) registers", ptxas_log, "ptxas registers")
    stack = _one(r"(\d+) bytes stack frame", ptxas_log, "ptxas stack frame")
    stores = _one(r"(\d+) bytes spill stores", ptxas_log, "ptxas spill stores")
    loads = _one(r"(\d+) bytes spill loads", ptxas_log, "ptxas spill loads")
    static = sum(int(n) for n in re.findall(r"(\d+) bytes smem", ptxas_log))
    return Resources(registers, stores + loads, static + dynamic_shared, stack + global_scratch)


def _meta(field: str, amdgcn: str) -> int:
    # The YAML metadata block writes "    .vgpr_count:     42".
    return _one(rf"^\s*\.{re.escape(field)}:\s+(\d+)\s*$", _metadata_block(amdgcn), f"AMDGPU {field}")


def _metadata_block(amdgcn: str) -> str:
    start = amdgcn.find(".amdgpu_metadata")
    end = amdgcn.find(".end_amdgpu_metadata")
    if start < 0 or end < start:
        raise UnreadableOutput("AMDGCN listing without an .amdgpu_metadata block")
    return amdgcn[start:end]


def amd(amdgcn: str, dynamic_shared: int, global_scratch: int) -> Resources:
    """From the AMDGCN listing's code object metadata, and what Triton allocates itself."""
    flags = re.MULTILINE
    waves = re.findall(r"^; Occupancy: (\d+)", amdgcn, flags)
    return Resources(
        registers=_meta("vgpr_count", amdgcn),
        spills=_meta("vgpr_spill_count", amdgcn) + _meta("sgpr_spill_count", amdgcn),
        shared=_meta("group_segment_fixed_size", amdgcn) + dynamic_shared,
        scratch=_meta("private_segment_fixed_size", amdgcn) + global_scratch,
        sgprs=_meta("sgpr_count", amdgcn),
        stated_waves=int(waves[0]) if len(waves) == 1 else None,
    )


# -------------------------------------------------------------------------- global memory accesses

_PTX_ACCESS = re.compile(r"\b(ld|st)\.global((?:\.[\w:]+)*)")
_PTX_BITS = re.compile(r"^[bfus](8|16|32|64)$")
_AMD_ACCESS = re.compile(r"\b(?:global|buffer)_(load|store)_(\w+)")
_AMD_BITS = {
    "dwordx4": 128, "b128": 128, "dwordx3": 96, "b96": 96, "dwordx2": 64, "b64": 64, "dword": 32,
    "b32": 32, "short": 16, "ushort": 16, "sshort": 16, "b16": 16, "short_d16": 16, "short_d16_hi": 16,
    "byte": 8, "ubyte": 8, "sbyte": 8, "b8": 8, "ubyte_d16": 8, "ubyte_d16_hi": 8,
}  # fmt: skip
# Line info (Triton compiles with it): `.file 2 "/dir/common.py"` (PTX) or `.file 2 "/dir" "common.py"`
# (AMDGCN), then `.loc 2 70 12` before the instructions of source line 70 of file 2 (the innermost
# location: the line of the tl.load itself, wherever it was inlined).
_FILE = re.compile(r'^\s*\.file\s+(\d+)\s+"([^"]*)"(?:\s+"([^"]*)")?', re.MULTILINE)
_LOC = re.compile(r"^\s*\.loc\s+(\d+)\s+(\d+)\s+\d+")


@dataclass(frozen=True)
class Access:
    """One global load or store instruction: its width per thread and the source line it comes from."""

    kind: str  # "load" or "store"
    bits: int  # bits per thread in this one instruction
    file: str  # the source file's name, "" without line info
    line: int


@dataclass(frozen=True)
class Accesses:
    """The global loads and stores of one kernel, in program order."""

    items: tuple[Access, ...]

    def widths(self, kind: str) -> Counter[int]:
        return Counter(a.bits for a in self.items if a.kind == kind)

    def as_dict(self) -> dict[str, dict[str, int]]:
        return {
            f"{kind}s": {str(bits): n for bits, n in sorted(self.widths(kind).items())}
            for kind in ("load", "store")
        }


def _files(asm: str) -> dict[str, str]:
    return {n: (name or path).rsplit("/", 1)[-1] for n, path, name in _FILE.findall(asm)}


def _ptx_bits(qualifiers: str) -> int:
    lanes, bits = 1, 0
    for q in qualifiers.split(".")[1:]:
        if q.startswith("v") and q[1:].isdigit():
            lanes = int(q[1:])
        elif match := _PTX_BITS.match(q):
            bits = int(match.group(1))
    if not bits:
        raise UnreadableOutput(f"PTX global access without an operand type: {qualifiers!r}")
    return lanes * bits


def _located(asm: str, width: Callable[[str], tuple[str, int] | None]) -> Accesses:
    files, where, found = _files(asm), ("", 0), []
    inline = False
    for text in asm.splitlines():
        # Triton emits PTX loads and stores as inline assembly, and LLVM numbers each line of an inline
        # block as if it followed the block's source line (32, 33, 34...): the location is the one in
        # effect where the block begins.
        if "// begin inline asm" in text or "// end inline asm" in text:
            inline = "begin" in text
        elif (loc := _LOC.match(text)) and not inline:
            where = (files.get(loc.group(1), ""), int(loc.group(2)))
        elif access := width(text):
            found.append(Access(access[0], access[1], *where))
    return Accesses(tuple(found))


def _ptx_width(text: str) -> tuple[str, int] | None:
    match = _PTX_ACCESS.search(text.split("//", 1)[0])  # not in a comment
    if match is None:
        return None
    return ("load" if match.group(1) == "ld" else "store"), _ptx_bits(match.group(2))


def _amd_width(text: str) -> tuple[str, int] | None:
    match = _AMD_ACCESS.search(text.split(";", 1)[0])  # not in a comment
    if match is None:
        return None
    kind, suffix = match.groups()
    if suffix not in _AMD_BITS:
        raise UnreadableOutput(f"AMDGCN access of unknown width: {kind}_{suffix}")
    return kind, _AMD_BITS[suffix]


def ptx_accesses(ptx: str) -> Accesses:
    return _located(ptx, _ptx_width)


def amdgcn_accesses(amdgcn: str) -> Accesses:
    return _located(amdgcn, _amd_width)
