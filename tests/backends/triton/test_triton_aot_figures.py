"""The ahead-of-time figures' arithmetic and parsing: target limits and occupancy, reading ptxas's
report, the AMDGPU code object metadata and the global accesses with their source lines. Pure Python:
no Triton needed."""

from __future__ import annotations

import pytest

from backends.triton.kernels.aot import resources, targets
from backends.triton.kernels.aot.targets import TARGETS, occupancy

SM80, SM90, GFX942 = TARGETS["sm_80"], TARGETS["sm_90"], TARGETS["gfx942"]


def test_targets_parse_and_reject_unknown_names():
    assert [t.name for t in targets.parse("sm_90, gfx942")] == ["sm_90", "gfx942"]
    assert len(targets.parse("all")) == len(TARGETS) == 5
    with pytest.raises(ValueError, match=r"target='sm_75' is not allowed; allowed: all, sm_80, sm_90"):
        targets.parse("sm_90,sm_75")
    with pytest.raises(ValueError, match="names no target"):
        targets.parse(" , ")


# The CUDA occupancy calculator's results for these launches on compute capability 9.0 / 8.0.
@pytest.mark.parametrize(
    ("target", "warps", "registers", "shared", "blocks", "fraction", "limiter"),
    [
        (SM90, 8, 64, 0, 4, 0.5, "registers"),  # 2048 registers a warp: 32 warps
        (SM90, 8, 32, 0, 8, 1.0, "warps"),
        (SM90, 8, 33, 0, 6, 48 / 64, "registers"),  # 33 * 32 = 1056 -> 1280 a warp: 51 warps, 6 blocks
        (SM90, 1, 255, 0, 8, 8 / 64, "registers"),  # 8160 -> 8192 a warp
        (SM90, 4, 16, 0, 16, 1.0, "warps"),
        (SM90, 1, 16, 0, 32, 0.5, "blocks"),  # 32 blocks at most
        (SM90, 4, 32, 100 * 1024, 2, 8 / 64, "shared"),  # 101 KiB a block with the reserved 1 KiB
        (SM80, 4, 32, 100 * 1024, 1, 4 / 64, "shared"),  # 164 KiB an SM
        (SM90, 4, 32, 228 * 1024, 0, 0.0, "shared"),  # over the 227 KiB one block may have
        (SM90, 4, 256, 0, 0, 0.0, "registers"),
        # Registers per SM sub-partition: 87 -> 2816 a warp, 5 warps in each quarter's 16 Ki, 20 in all
        # (64 Ki / 2816 would say 23, and 11 blocks).
        (SM80, 2, 87, 0, 10, 20 / 64, "registers"),
    ],
)
def test_nvidia_occupancy(target, warps, registers, shared, blocks, fraction, limiter):
    got = occupancy(target, warps, registers, shared)
    assert (got.blocks, got.limiter) == (blocks, limiter)
    assert got.fraction == pytest.approx(fraction)


@pytest.mark.parametrize(
    ("warps", "vgprs", "shared", "sgprs", "blocks", "fraction", "limiter"),
    [
        (8, 76, 2048, 60, 3, 0.75, "registers"),  # 80 VGPRs: 6 waves a SIMD, 2 a workgroup
        (8, 64, 0, 60, 4, 1.0, "warps"),
        (8, 40, 40 * 1024, 60, 1, 0.25, "shared"),  # one 40 KiB workgroup in 64 KiB
        (1, 42, 0, 60, 32, 1.0, "warps"),  # one-wave workgroups fill the 4 SIMDs side by side
        (2, 120, 0, 60, 8, 0.5, "registers"),  # 4 waves a SIMD, 2 SIMDs a workgroup
        (8, 64, 0, 104, 3, 0.75, "registers"),  # more than 100 SGPRs: 7 waves a SIMD
        (4, 600, 0, 60, 0, 0.0, "registers"),
        (2, 40, 0, 60, 16, 1.0, "warps"),  # 16 two-wave workgroups: all 32 slots, all 16 barriers
    ],
)
def test_amd_occupancy(warps, vgprs, shared, sgprs, blocks, fraction, limiter):
    got = occupancy(GFX942, warps, vgprs, shared, sgprs)
    assert (got.blocks, got.limiter) == (blocks, limiter)
    assert got.fraction == pytest.approx(fraction)


def test_amd_workgroups_per_cu_follow_llvm():
    assert [targets.amd_max_blocks(GFX942, w) for w in (1, 2, 4, 8)] == [32, 16, 8, 4]


def test_amd_register_waves_follow_llvm():
    assert [targets.amd_sgpr_waves(n) for n in (40, 80, 81, 88, 100, 101)] == [10, 10, 9, 9, 8, 7]
    assert [targets.amd_vgpr_waves(GFX942, n) for n in (1, 64, 65, 72, 128, 256, 512)] == [
        8,
        8,
        7,
        7,
        4,
        2,
        1,
    ]


PTXAS_LOG = """\
ptxas info    : 11 bytes gmem
ptxas info    : Compiling entry function 'rms_norm_bwd' for 'sm_90a'
ptxas info    : Function properties for rms_norm_bwd
    8 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 512 bytes smem
"""


def test_ptxas_report():
    used = resources.nvidia(PTXAS_LOG, dynamic_shared=4096, global_scratch=0)
    assert (used.registers, used.spills, used.shared, used.scratch) == (255, 20, 4608, 8)
    with pytest.raises(resources.UnreadableOutput, match="ptxas registers"):
        resources.nvidia("ptxas info : nothing", 0, 0)


AMDGCN = """\
\t.file\t1 "/src/backends/triton_kernels" "layer_norm.py"
\t.file\t2 "/src/backends/triton_kernels" "common.py"
\t.loc\t2 70 12                         ; common.py:70:12 @[ layer_norm.py:70:13 ]
\tbuffer_load_dwordx4 v[2:5], v30, s[4:7], 0 offen
\t.loc\t1 66 11
\tglobal_load_ushort v3, v[0:1], off
\tbuffer_store_dword v3, v0, s[4:7], 0 offen ; not buffer_load_dwordx4 in a comment
; Occupancy: 6
\t.amdgpu_metadata
    .agpr_count:     0
    .group_segment_fixed_size: 0
    .private_segment_fixed_size: 16
    .sgpr_count:     60
    .sgpr_spill_count: 0
    .vgpr_count:     76
    .vgpr_spill_count: 2
\t.end_amdgpu_metadata
"""


def test_amd_metadata_and_accesses():
    used = resources.amd(AMDGCN, dynamic_shared=2048, global_scratch=0)
    assert (used.registers, used.spills, used.shared, used.scratch) == (76, 2, 2048, 16)
    assert (used.sgprs, used.stated_waves) == (60, 6)
    accesses = resources.amdgcn_accesses(AMDGCN).items
    assert [(a.kind, a.bits, a.file, a.line) for a in accesses] == [
        ("load", 128, "common.py", 70),
        ("load", 16, "layer_norm.py", 66),
        ("store", 32, "layer_norm.py", 66),
    ]
    with pytest.raises(resources.UnreadableOutput, match="metadata"):
        resources.amd("buffer_load_dword v1", 0, 0)


PTX = """\
\t.loc\t2 65 12, function_name $L__info_string0, inlined_at 1 34 17 // common.py:65:12
\t@%p1 ld.global.v4.b32 { %r2, %r3, %r4, %r5 }, [ %rd2 + 0 ];
\t.loc\t1 76 9
\t// begin inline asm
\t.loc\t1 77 9
\tmov.u32 %r12, %r16;
\t.loc\t1 78 9
\t@%p3 ld.global.L1::evict_last.v2.b64 { %rd4, %rd5 }, [ %rd4 + 0 ];
\t// end inline asm
\t@%p4 st.global.b16 [ %rd8 + 0 ], { %rs1 };
\t// ld.global.b8 in a comment
\t.file\t1 "/src/backends/triton_kernels/layer_norm.py"
\t.file\t2 "/src/backends/triton_kernels/common.py"
"""


def test_ptx_accesses_with_their_source_lines():
    accesses = resources.ptx_accesses(PTX)
    assert [(a.kind, a.bits, a.file, a.line) for a in accesses.items] == [
        ("load", 128, "common.py", 65),
        ("load", 128, "layer_norm.py", 76),
        ("store", 16, "layer_norm.py", 76),
    ]
    assert accesses.as_dict() == {"loads": {"128": 2}, "stores": {"16": 1}}
    with pytest.raises(resources.UnreadableOutput, match="operand type"):
        resources.ptx_accesses("ld.global.v4 {%r1}, [%rd1];")
