#!/usr/bin/env bash
# GPU check of the triton backend, for a CUDA machine: the conformance run over the ci profile with
# the kernels compiled natively (LayerNorm, RMSNorm, add+RMSNorm, GroupNorm, InstanceNorm), then forward
# and forward+backward timings (bf16, fp16; rows 4096x4096 and 4096x8192; GroupNorm with 32 groups and
# InstanceNorm on 2x320x32x32 and 4x64x64x64; against torch-functional) with GB/s, then the ahead-of-time
# figures of this GPU's architecture for the benchmark sweep's kernels (registers, spills, shared memory,
# occupancy, 128-bit row accesses: python -m backends.triton_kernels.aot), so the static estimate and the
# measured GB/s sit side by side. Everything lands in one folder.
#
#   bash scripts/gpu_check.sh [OUT_DIR]          (default .normconf/gpu-check; the device tool: $OUT)
#
# Installs what it needs into .normconf/gpu-venv, a virtual environment that sees the machine's own CUDA
# build of torch (and its Triton) and adds normconf without touching them; works offline when the
# machine already has pytest, numpy and ml_dtypes. Budget: 9 minutes in all (each step has its own
# timeout); the exit status is the conformance run's.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR=${1:-${OUT:-.normconf/gpu-check}}
PYTHON=${PYTHON:-python3}
VENV=${VENV:-.normconf/gpu-venv}
WORKERS=${WORKERS:-8}
mkdir -p "$OUT_DIR"
LOG="$OUT_DIR/gpu_check.log"
exec > >(tee -a "$LOG") 2>&1
export PYTHONUNBUFFERED=1
unset TRITON_INTERPRET  # native kernels: the interpreter would hide every compilation problem

step() { echo; echo "== $* ($(date -u +%H:%M:%S))"; }

step "machine"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv \
    | tee "$OUT_DIR/gpu.csv" || { echo "no NVIDIA GPU here: nothing to check"; exit 2; }
git rev-parse HEAD 2>/dev/null | tee "$OUT_DIR/commit.txt"

step "install"
if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv --system-site-packages "$VENV" || exit 3
fi
missing=$("$VENV/bin/python" - <<'PY'
import importlib.util
need = {"torch": "torch", "triton": "triton>=3.2", "numpy": "numpy>=1.26", "ml_dtypes": "ml_dtypes>=0.4",
        "pytest": "pytest>=8", "xdist": "pytest-xdist>=3.5"}
print(" ".join(spec for module, spec in need.items() if importlib.util.find_spec(module) is None))
PY
)
if [ -n "$missing" ]; then
    echo "installing: $missing"
    timeout 240 "$VENV/bin/python" -m pip install --quiet $missing || { echo "could not install $missing"; exit 3; }
fi
# normconf itself, without dependencies, so the machine's CUDA torch and Triton stay as they are.
timeout 120 "$VENV/bin/python" -m pip install --quiet --no-deps --no-build-isolation -e . || exit 3
"$VENV/bin/python" -m pip list 2>/dev/null | grep -i -E '^(torch|triton|numpy|ml.dtypes|pytest) ' \
    | tee "$OUT_DIR/packages.txt"
"$VENV/bin/python" -m pytest conformance --list-backends -p no:cacheprovider | tee "$OUT_DIR/backends.txt"
grep -A3 '^triton' "$OUT_DIR/backends.txt" | grep -q 'device cuda' \
    || { echo "the triton backend is not running natively on the GPU"; exit 4; }

step "conformance: triton, ci profile, native"
timeout 300 "$VENV/bin/python" -m pytest conformance --backend triton --profile ci -n "$WORKERS" \
    -p no:cacheprovider -q --results "$OUT_DIR/conformance.jsonl" | tail -n 15
status=${PIPESTATUS[0]}

step "timings: forward, forward+backward"
timeout 180 "$VENV/bin/python" scripts/triton_timings.py --out "$OUT_DIR" \
    --shapes 4096x4096,4096x8192 --group-shapes 2x320x32x32,4x64x64x64 --groups 32 \
    --dtypes bfloat16,float16 --backends triton,torch-functional

step "ahead-of-time figures for this GPU's architecture (benchmark sweep kernels)"
# compute_cap "9.0" -> sm_90; the sweep's shapes launch the same kernel specializations as the timings'.
cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -n 1 | tr -d ' .')
case "$cap" in
    80|90|100)
        timeout 120 "$VENV/bin/python" -m backends.triton_kernels.aot --targets "sm_$cap" --sources sweep \
            --jobs "$WORKERS" --json "$OUT_DIR/aot.json" | tee "$OUT_DIR/aot.md"
        echo "ahead-of-time check exit status ${PIPESTATUS[0]} (1: a specialization failed a check, see above)";;
    *)
        echo "compute capability $cap has no ahead-of-time target (sm_80, sm_90, sm_100): figures skipped";;
esac

step "done: conformance exit status $status; files in $OUT_DIR"
ls -l "$OUT_DIR"
exit "$status"
