"""The GPU targets the kernels are compiled for ahead of time, their stated limits, and the standard
theoretical-occupancy calculation from a compiled kernel's resources. Pure Python (no Triton import).

NVIDIA figures are those of the CUDA C++ Programming Guide's table of technical specifications per
compute capability (registers, warps, blocks and shared memory per SM; 1 KiB of shared memory reserved
by the system per block since 8.0) and the CUDA occupancy calculator's allocation units (registers per
warp in units of 256, shared memory in units of 128 bytes). AMD figures are those of the CDNA2 / CDNA3
instruction set references and LLVM's AMDGPU backend (AMDGPUUsage; GCNSubtarget): 4 SIMDs per compute
unit, at most 8 waves per SIMD, 512 unified vector registers (VGPR + AGPR) per lane and SIMD allocated in
granules of 8, 64 KiB of LDS per compute unit. Multiprocessor counts are those of the named product,
which only the launch grid depends on, never the compiled code.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Target:
    """One GPU architecture: how Triton names it and what one multiprocessor (SM / CU) holds."""

    name: str  # sm_90, gfx942: what the command line and the tables say
    backend: str  # Triton's GPUTarget backend: "cuda" or "hip"
    arch: int | str  # GPUTarget arch: compute capability 90, or "gfx942"
    warp_size: int  # threads per warp / lanes per wave
    product: str  # the part whose multiprocessor count is given
    multiprocessors: int  # SMs / CUs of that part
    registers: int  # NVIDIA: 32-bit registers per SM; AMD: vector registers per lane and SIMD
    max_registers: int  # most registers one thread (lane) may use
    register_unit: int  # NVIDIA: registers per warp allocated in units of this; AMD: VGPR granule
    max_warps: int  # NVIDIA: resident warps per SM; AMD: resident waves per SIMD
    max_blocks: int  # resident thread blocks (workgroups) per SM / CU
    shared: int  # bytes of shared memory (LDS) per SM / CU
    shared_per_block: int  # the most one block may have (NVIDIA: with the opt-in carve-out)
    shared_reserved: int  # bytes the system reserves per block (NVIDIA since 8.0)
    shared_unit: int  # allocation unit of shared memory per block
    simds: int = 1  # AMD: SIMDs per CU that a workgroup's waves are spread over
    # NVIDIA: the register file is split over 4 SM sub-partitions, each allocating whole warps
    # (cuda_occupancy.h, cudaOccMaxBlocksPerSMRegsLimit).
    register_partitions: int = 1

    @property
    def vendor(self) -> str:
        return "nvidia" if self.backend == "cuda" else "amd"


def _nvidia(capability: int, product: str, sms: int, shared_kib: int) -> Target:
    return Target(
        name=f"sm_{capability}",
        backend="cuda",
        arch=capability,
        warp_size=32,
        product=product,
        multiprocessors=sms,
        registers=65536,
        max_registers=255,
        register_unit=256,
        max_warps=64,
        max_blocks=32,
        shared=shared_kib * 1024,
        shared_per_block=(shared_kib - 1) * 1024,
        shared_reserved=1024,
        shared_unit=128,
        register_partitions=4,
    )


def _amd(arch: str, product: str, cus: int) -> Target:
    return Target(
        name=arch,
        backend="hip",
        arch=arch,
        warp_size=64,
        product=product,
        multiprocessors=cus,
        registers=512,
        max_registers=512,
        register_unit=8,
        max_warps=8,
        # Workgroups per CU (LLVM's getMaxWorkGroupsPerCU): one-wave workgroups up to the CU's 32 wave
        # slots; wider ones also need one of the CU's 16 barriers (amd_max_blocks).
        max_blocks=32,
        shared=65536,
        shared_per_block=65536,
        shared_reserved=0,
        shared_unit=1,
        simds=4,
    )


TARGETS: dict[str, Target] = {
    t.name: t
    for t in (
        _nvidia(80, "A100 SXM", 108, 164),
        _nvidia(90, "H100 SXM", 132, 228),
        _nvidia(100, "B200", 148, 228),
        _amd("gfx90a", "MI250X (one GCD)", 110),
        _amd("gfx942", "MI300X", 304),
    )
}


def parse(names: str) -> tuple[Target, ...]:
    """``"sm_90,gfx942"`` (or ``"all"``) -> the targets; an unknown name is an error listing the choices."""
    if names.strip() == "all":
        return tuple(TARGETS.values())
    chosen = []
    for name in (n.strip() for n in names.split(",") if n.strip()):
        if name not in TARGETS:
            raise ValueError(f"target={name!r} is not allowed; allowed: all, {', '.join(TARGETS)}")
        chosen.append(TARGETS[name])
    if not chosen:
        raise ValueError(f"targets={names!r} names no target; allowed: all, {', '.join(TARGETS)}")
    return tuple(chosen)


@dataclass(frozen=True)
class Occupancy:
    """Resident blocks per multiprocessor and the fraction of its warp (wave) slots they fill."""

    blocks: int  # 0: the kernel cannot launch at all (too many registers or too much shared memory)
    fraction: float  # resident warps / the most the SM (or the CU's SIMDs) can hold
    limiter: str  # what bounds it: "warps", "registers", "shared", "blocks"


def _ceil(value: int, unit: int) -> int:
    return -(-value // unit) * unit


def shared_per_block(target: Target, shared: int) -> int:
    """What one block occupies: its own shared memory plus the reserved part, in allocation units."""
    return _ceil(shared + target.shared_reserved, target.shared_unit)


def occupancy(target: Target, warps: int, registers: int, shared: int, sgprs: int = 0) -> Occupancy:
    """Theoretical occupancy of a kernel launched with ``warps`` warps (waves) per block that uses
    ``registers`` per thread (AMD: unified vector registers per lane), ``shared`` bytes of shared
    memory (LDS) per block and, on AMD, ``sgprs`` scalar registers per wave."""
    if registers > target.max_registers:
        return Occupancy(0, 0.0, "registers")
    if shared > target.shared_per_block:
        return Occupancy(0, 0.0, "shared")
    if target.vendor == "nvidia":
        return _nvidia_occupancy(target, warps, registers, shared)
    return _amd_occupancy(target, warps, registers, shared, sgprs)


def _pick(limits: dict[str, int]) -> tuple[int, str]:
    limiter = min(limits, key=lambda k: limits[k])  # first of the tied ones: the dict's order
    return limits[limiter], limiter


def _nvidia_occupancy(target: Target, warps: int, registers: int, shared: int) -> Occupancy:
    per_warp = _ceil(max(registers, 1) * target.warp_size, target.register_unit)
    parts = target.register_partitions
    limits = {
        "warps": target.max_warps // warps,
        "registers": (target.registers // parts // per_warp) * parts // warps,
        "shared": target.shared // shared_per_block(target, shared),
        "blocks": target.max_blocks,
    }
    blocks, limiter = _pick(limits)
    return Occupancy(blocks, blocks * warps / target.max_warps, limiter)


def amd_sgpr_waves(sgprs: int) -> int:
    """Waves per SIMD that the scalar register file allows (LLVM, GCN 8 and later: 800 SGPRs per SIMD,
    allocated in granules of 16 with the 6 hidden ones; getOccupancyWithNumSGPRs)."""
    for bound, waves in ((80, 10), (88, 9), (100, 8)):
        if sgprs <= bound:
            return waves
    return 7


def amd_vgpr_waves(target: Target, vgprs: int) -> int:
    """Waves per SIMD that the vector register file allows."""
    return min(target.registers // _ceil(max(vgprs, 1), target.register_unit), target.max_warps)


def amd_max_blocks(target: Target, warps: int) -> int:
    """Workgroups one CU holds at most: a workgroup of several waves takes one of 16 barriers."""
    return target.max_blocks if warps == 1 else min(target.max_blocks // warps, 16)


def _amd_occupancy(target: Target, warps: int, vgprs: int, shared: int, sgprs: int) -> Occupancy:
    # A workgroup's waves are spread over the CU's SIMDs: ceil(warps / simds) of them on each.
    per_simd = -(-warps // target.simds)
    lanes_limit = {
        "warps": target.max_warps,
        "registers": min(amd_vgpr_waves(target, vgprs), amd_sgpr_waves(sgprs)),
    }
    slots, slot_limiter = _pick(lanes_limit)
    # Workgroups narrower than the CU's SIMDs fill them side by side.
    by_slots = slots * target.simds // warps if warps < target.simds else slots // per_simd
    limits = {
        slot_limiter: by_slots,
        "shared": target.shared // shared_per_block(target, shared) if shared else target.max_blocks,
        "blocks": amd_max_blocks(target, warps),
    }
    blocks, limiter = _pick(limits)
    return Occupancy(blocks, blocks * warps / (target.max_warps * target.simds), limiter)
