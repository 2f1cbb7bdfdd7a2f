#!/usr/bin/env bash
# GPU check for a CUDA machine, in one call: the conformance run of the GPU backends (triton,
# triton-inplace, torch-functional, torch-nn, torch-compile) over the ci profile with the kernels
# compiled natively, then forward and forward+backward timings (bf16, fp16; against torch-functional,
# our kernels replayed from a CUDA graph and Liger-Kernel's where installed) with GB/s, wall time split
# into device and host time, launches and host-to-device copies per call, then the ahead-of-time figures of this GPU's architecture for the benchmark sweep's kernels
# (python -m backends.triton.kernels.aot), so the static estimate and the measured GB/s sit side by side.
#
#   bash scripts/gpu_check.sh [--quick] [OUT_DIR]     (default .normconf/gpu-check; the device tool: $OUT)
#
# It runs with the interpreter it is given (PYTHON, default python3): on a GPU image that interpreter
# is itself a virtual environment holding CUDA torch and Triton, and nothing can be downloaded, so
# normconf is installed into it with --no-deps --no-index (from WHEELS=DIR too, for pure-Python
# packages the image lacks; nothing is fetched). A package still missing stops the check with its name.
# --quick: the smoke profile and one timing shape, within 5 minutes on one H200; the full check takes
# up to 9 (each step has its own timeout). The exit status is the conformance run's.
#
# For testing the script's logic without a GPU: DEVICE=cpu expects the backends on the CPU, BACKENDS
# overrides the backend list, TIMINGS=0 and AOT=0 leave those steps out.
set -uo pipefail
cd "$(dirname "$0")/.."
QUICK=0
if [ "${1:-}" = "--quick" ]; then QUICK=1; shift; fi
OUT_DIR=${1:-${OUT:-.normconf/gpu-check}}
PYTHON=${PYTHON:-python3}
WORKERS=${WORKERS:-8}
DEVICE=${DEVICE:-cuda}
BACKENDS=${BACKENDS:-triton,triton-inplace,torch-functional,torch-nn,torch-compile}
TIMINGS=${TIMINGS:-1}
# Timed side by side: ours launched and replayed from a CUDA graph (the floor of host time), torch's, and
# Liger-Kernel's where the image has it (a backend that is unavailable is left out with its reason).
TIMED_BACKENDS=${TIMED_BACKENDS:-triton,triton-graph,torch-functional,liger-rms,liger-layer-norm,liger-add-rms}
AOT=${AOT:-1}
if [ "$QUICK" = 1 ]; then
    PROFILE=smoke SHAPES=4096x8192 GROUP_SHAPES=2x320x32x32 RUN_TIMEOUT=180 TIMING_TIMEOUT=60
else
    PROFILE=ci SHAPES=4096x4096,4096x8192 GROUP_SHAPES=2x320x32x32,4x64x64x64 RUN_TIMEOUT=300 TIMING_TIMEOUT=150
fi
mkdir -p "$OUT_DIR"
LOG="$OUT_DIR/gpu_check.log"
exec > >(tee -a "$LOG") 2>&1
export PYTHONUNBUFFERED=1
unset TRITON_INTERPRET  # native kernels: the interpreter would hide every compilation problem

step() { echo; echo "== $* ($(date -u +%H:%M:%S))"; }

step "machine"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem,compute_cap \
    --format=csv | tee "$OUT_DIR/gpu.csv" || { echo "no NVIDIA GPU here (nvidia-smi failed): nothing to check"; exit 2; }
git rev-parse HEAD 2>/dev/null | tee "$OUT_DIR/commit.txt"
"$PYTHON" --version || { echo "PYTHON=$PYTHON is not an interpreter"; exit 3; }

step "install (into $PYTHON, no downloads)"
here=$(pwd)
where=$("$PYTHON" -c 'import conformance, os; print(os.path.dirname(os.path.dirname(conformance.__file__)))' 2>/dev/null)
if [ "$where" = "$here" ]; then
    echo "normconf is already importable from this checkout"
else
    links=()
    if [ -n "${WHEELS:-}" ]; then links=(--find-links "$WHEELS"); fi
    # --no-deps: the image's CUDA torch and Triton stay as they are; --no-index: nothing is downloaded.
    timeout 120 "$PYTHON" -m pip install --quiet --no-deps --no-index --no-build-isolation "${links[@]}" -e . \
        || { echo "could not install normconf into $PYTHON"; exit 3; }
fi
missing=$("$PYTHON" - <<'PY'
import importlib.util
need = ("torch", "triton", "numpy", "ml_dtypes", "pytest", "xdist", "hypothesis", "jinja2", "packaging")
print(" ".join(module for module in need if importlib.util.find_spec(module) is None))
PY
)
if [ -n "$missing" ]; then
    if [ -n "${WHEELS:-}" ]; then
        timeout 120 "$PYTHON" -m pip install --quiet --no-index --find-links "$WHEELS" $missing
    fi
    missing=$("$PYTHON" -c "import importlib.util as u; print(' '.join(m for m in '$missing'.split() if u.find_spec(m) is None))")
    [ -z "$missing" ] || { echo "missing on $PYTHON, and not downloadable here: $missing (bring wheels: WHEELS=DIR)"; exit 3; }
fi
"$PYTHON" -m pip list 2>/dev/null | grep -i -E '^(torch|triton|numpy|ml.dtypes|pytest|normconf) ' \
    | tee "$OUT_DIR/packages.txt"
"$PYTHON" -m pytest conformance --list-backends -p no:cacheprovider > "$OUT_DIR/backends.txt"
for backend in ${BACKENDS//,/ }; do
    grep -A3 -x -e "$backend" "$OUT_DIR/backends.txt" | grep -q "device $DEVICE" \
        || { echo "backend $backend is not running on $DEVICE:"; grep -A3 -x -e "$backend" "$OUT_DIR/backends.txt"; exit 4; }
done
echo "backends on $DEVICE: $BACKENDS"

step "conformance: $BACKENDS, $PROFILE profile"
timeout "$RUN_TIMEOUT" "$PYTHON" -m pytest conformance --backend "$BACKENDS" --profile "$PROFILE" -n "$WORKERS" \
    -p no:cacheprovider -q --results "$OUT_DIR/conformance.jsonl" | tail -n 40
status=${PIPESTATUS[0]}

if [ "$TIMINGS" = 1 ]; then
    step "timings: forward, forward+backward"
    timeout "$TIMING_TIMEOUT" "$PYTHON" scripts/triton_timings.py --out "$OUT_DIR" \
        --shapes "$SHAPES" --group-shapes "$GROUP_SHAPES" --groups 32 \
        --dtypes bfloat16,float16 --backends "$TIMED_BACKENDS"
fi

if [ "$AOT" = 1 ] && [ "$QUICK" = 0 ]; then
    step "ahead-of-time figures for this GPU's architecture (benchmark sweep kernels)"
    # compute_cap "9.0" -> sm_90; the sweep's shapes launch the same kernel specializations as the timings'.
    cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -n 1 | tr -d ' .')
    case "$cap" in
        80|90|100)
            timeout 120 "$PYTHON" -m backends.triton.kernels.aot --targets "sm_$cap" --sources sweep \
                --jobs "$WORKERS" --json "$OUT_DIR/aot.json" | tee "$OUT_DIR/aot.md"
            echo "ahead-of-time check exit status ${PIPESTATUS[0]} (1: a specialization failed a check, see above)";;
        *)
            echo "compute capability $cap has no ahead-of-time target (sm_80, sm_90, sm_100): figures skipped";;
    esac
fi

step "done: conformance exit status $status; files in $OUT_DIR"
ls -l "$OUT_DIR"
exit "$status"
