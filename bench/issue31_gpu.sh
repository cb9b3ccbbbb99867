#!/usr/bin/env bash
# Issue 31's rows on one GPU, native vs remote in each run, in one command under 8 minutes (an H100):
#   OUT=/some/dir bash bench/issue31_gpu.sh            (DRY_RUN=1: print the steps and their budgets only)
# 0. builds the native loop and the shim in place (the worker must serve calls in C) and says so, and
#    checks what the loop serves gives native results (tests/gpu/remote/run.py --only native_calls);
# 1. bench_remote.py over the worker's local socket: async copies 16 in flight into/from page-locked
#    memory (64 KiB / 1 MiB / 16 MiB), synchronous copies 4 KiB / 64 KiB / 1 MiB, graph replays, the
#    event loop of a benchmark harness, round trip and launches;
# 2. bench_torch_patterns.py over the local socket: make_graphed_callables MLP training and triton
#    do_bench of a 1000x1000 matmul (its copy patterns are step 1's rows, through cuda.bindings);
# 3. training over TCP + TLS as a client on another host (tests/gpu/remote/run.py --encrypt --only
#    training: ResNet-50 bf16 b64 and GPT-2-style);
# 4. if time is left: small copies over the local socket with those up to 1 MiB in their frames (served
#    by the native loop) instead of through shared memory (GPUPOOL_SHIM_SHARED_MIN_KIB=1025), to pick
#    that default; bench_remote.py over loopback TCP + TLS, the same patterns.
# Each step is bounded by its own budget and by what is left of the whole (BUDGET_S, default 470 s);
# a failing or cut step is reported and the next one runs. The table at the end is for pasting;
# every step's full output is under $OUT/<step>/.
set -u
: "${OUT:?set OUT to a folder for the results}"
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
# GPU 0 alone: natively, torch failed to start ("device=1, num_gpus=1") while other runs used GPU 1
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
BUDGET_S=${BUDGET_S:-470}
DRY_RUN=${DRY_RUN:-0}
START=$SECONDS
mkdir -p "$OUT"
TABLE="$OUT/table.md"
: >"$TABLE"

step() { # name, seconds, command...: run within its budget and what is left of the whole
    local name=$1 seconds=$2
    shift 2
    local left=$((BUDGET_S - (SECONDS - START)))
    [ "$seconds" -gt "$left" ] && seconds=$left
    if [ "$DRY_RUN" = 1 ]; then
        echo "== $name (up to ${seconds} s): $*"
        return 0
    fi
    if [ "$seconds" -lt 20 ]; then
        echo "!! $name skipped: ${left} s of the ${BUDGET_S} s left" | tee -a "$TABLE"
        return 0
    fi
    mkdir -p "$OUT/$name"
    echo "== $name (up to ${seconds} s): $*"
    OUT="$OUT/$name" timeout -k 10 "$seconds" "$@" >"$OUT/$name/stdout.txt" 2>"$OUT/$name/stderr.txt"
    local rc=$?
    [ "$rc" -eq 0 ] || echo "!! $name ended with status $rc after $((SECONDS - START)) s (see $OUT/$name/stderr.txt)"
    return 0
}

rows() { # name, title: the step's markdown rows under a heading of the table
    local name=$1 title=$2
    [ "$DRY_RUN" = 1 ] && return 0
    {
        echo
        echo "#### $title"
        grep '^|' "$OUT/$name/stdout.txt" 2>/dev/null ||
            echo "(no rows: $(grep -v '^\s*$' "$OUT/$name/stderr.txt" 2>/dev/null | tail -1))"
    } >>"$TABLE"
}

PATTERNS=round_trip,launches,copies,dtoh_async,htod_async,graph,events
step build 90 "$PY" setup.py build_ext --inplace -q
if [ "$DRY_RUN" != 1 ]; then
    "$PY" - <<'EOF' | tee -a "$TABLE"
from virtualize.server import _native_dispatch
print("native loop:", "built" if _native_dispatch._load() is not None else "NOT BUILT (every call through Python)")
EOF
    { nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"; } |
        head -1 | sed 's/^/GPU: /' | tee -a "$TABLE"
fi

step correctness 60 "$PY" tests/gpu/remote/run.py --only native_calls
if [ "$DRY_RUN" != 1 ]; then
    grep -- '^--> ' "$OUT/correctness/stdout.txt" 2>/dev/null | sed 's/^--> /correctness: /' | tee -a "$TABLE"
fi

step local 110 "$PY" bench/bench_remote.py --patterns "$PATTERNS" --max-copy-mib 16
rows local "bench_remote.py, local socket (a client on the GPU server)"

step torch 150 "$PY" bench/bench_torch_patterns.py --timeout 70 --patterns graphed_mlp,do_bench
rows torch "bench_torch_patterns.py, local socket"

step training_tls 200 "$PY" tests/gpu/remote/run.py --encrypt --only training
if [ "$DRY_RUN" != 1 ]; then
    {
        echo
        echo "#### Training over TCP + TLS (tests/gpu/remote/run.py --encrypt --only training)"
        echo "| training | status | native vs remote |"
        echo "| --- | --- | --- |"
        sed -n 's/^--> \([A-Z]*\): \(training [^ ]*\) (\(.*\))$/| \2 | \1 | \3 |/p' "$OUT/training_tls/stdout.txt" 2>/dev/null
    } >>"$TABLE"
fi

step copies_in_frames 45 env GPUPOOL_SHIM_SHARED_MIN_KIB=1025 "$PY" bench/bench_remote.py --patterns copies \
    --max-copy-mib 1
rows copies_in_frames "bench_remote.py copies, local socket, up to 1 MiB in their frames (GPUPOOL_SHIM_SHARED_MIN_KIB=1025)"

step tls 110 "$PY" bench/bench_remote.py --tcp --encrypt --patterns "$PATTERNS" --max-copy-mib 16
rows tls "bench_remote.py, loopback TCP + TLS (as a client on another host)"

echo
echo "== done in $((SECONDS - START)) s: $OUT (table: $TABLE)"
[ "$DRY_RUN" = 1 ] || cat "$TABLE"
