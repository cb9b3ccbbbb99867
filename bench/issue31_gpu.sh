#!/usr/bin/env bash
# Issue 31's rows on one GPU, native vs remote in each run, in one command under 10 minutes (an H100, root):
#   OUT=/some/dir bash bench/issue31_gpu.sh            (DRY_RUN=1: print the steps and their budgets only)
# 0. builds the native loop and the shim in place (the worker must serve calls in C) and says so, and
#    checks what the loop serves gives native results (tests/gpu/remote/run.py --only native_calls);
# 1. bench_remote.py over the worker's local socket: async copies 16 in flight into/from page-locked
#    memory (64 KiB / 1 MiB / 16 MiB), synchronous copies 4 KiB / 64 KiB / 1 MiB, graph replays, the
#    event loop of a benchmark harness, round trip and launches;
# 2. where a synchronous 1 MiB copy's time goes: bench_remote.py --profile (the shim's profile says
#    whether the copies went through the memory shared with the worker, and its time copying bytes vs
#    waiting for the worker), then the same copies with one copying thread in the program
#    (GPUPOOL_SHIM_COPY_THREADS=1), with the worker's Python serving them (GPUPOOL_WORKER_NATIVE=0),
#    with the copies in their frames (GPUPOOL_SHIM_SHARED_MIN_KIB=1025) and with both sides polling
#    1 ms instead of 40 µs before they sleep (a sleeping thread's wake-up on the copy's path?);
# 3. training as a client on another host gets it: the worker and the program in two network
#    namespaces across a veth shaped to 25 Gbit/s and 20 µs each way, TLS on (tests/gpu/remote/run.py
#    --link --only training: ResNet-50 bf16 b64 and GPT-2-style; SKIP with the reason without root);
# 4. bench_torch_patterns.py over the local socket: make_graphed_callables MLP training and triton
#    do_bench of a 1000x1000 matmul (its copy patterns are step 1's rows, through cuda.bindings);
# 5. if time is left: bench_remote.py over loopback TCP + TLS, the same patterns as step 1.
# Each step is bounded by its own budget and by what is left of the whole (BUDGET_S, default 560 s);
# a failing or cut step is reported and the next one runs. The table at the end is for pasting;
# every step's full output is under $OUT/<step>/.
set -u
: "${OUT:?set OUT to a folder for the results}"
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
# GPU 0 alone: natively, torch failed to start ("device=1, num_gpus=1") while other runs used GPU 1
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
BUDGET_S=${BUDGET_S:-560}
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

step copies_profile 40 "$PY" bench/bench_remote.py --patterns copies --min-copy-mib 1 --max-copy-mib 1 --profile
rows copies_profile "synchronous 1 MiB copies, local socket, profiled (GPUPOOL_SHIM_PROFILE=1)"
if [ "$DRY_RUN" != 1 ]; then
    grep -h 'memory shared with the worker\|cuMemcpyHtoD_v2\|cuMemcpyDtoH_v2\|cuCtxSynchronize ' \
        "$OUT"/copies_profile/shim-profile-*.txt 2>/dev/null | sed 's/^gpupool: /    /' >>"$TABLE"
fi
for variant in GPUPOOL_SHIM_COPY_THREADS=1 GPUPOOL_WORKER_NATIVE=0 GPUPOOL_SHIM_SHARED_MIN_KIB=1025 \
    "GPUPOOL_WORKER_SPIN_US=1000 GPUPOOL_SHIM_SPIN_US=1000"; do
    name=copies_${variant%%=*}
    # shellcheck disable=SC2086 # a variant is one or more NAME=VALUE words
    step "$name" 30 env $variant "$PY" bench/bench_remote.py --patterns copies --min-copy-mib 1 --max-copy-mib 1
    rows "$name" "synchronous 1 MiB copies, local socket, $variant"
done

step training_link 240 "$PY" tests/gpu/remote/run.py --link --only training
if [ "$DRY_RUN" != 1 ]; then
    {
        echo
        echo "#### Training across a shaped link, TLS on (tests/gpu/remote/run.py --link --only training)"
        grep -h '^=== a shaped link' "$OUT/training_link/stdout.txt" 2>/dev/null | sed 's/^=== //'
        echo "| training | status | native vs remote |"
        echo "| --- | --- | --- |"
        sed -n 's/^--> \([A-Z]*\): \(training .*\) (\(.*\))$/| \2 | \1 | \3 |/p' "$OUT/training_link/stdout.txt" 2>/dev/null
    } >>"$TABLE"
fi

step torch 150 "$PY" bench/bench_torch_patterns.py --timeout 70 --patterns graphed_mlp,do_bench
rows torch "bench_torch_patterns.py, local socket"

step tls 110 "$PY" bench/bench_remote.py --tcp --encrypt --patterns "$PATTERNS" --max-copy-mib 16
rows tls "bench_remote.py, loopback TCP + TLS (as a client on another host)"

echo
echo "== done in $((SECONDS - START)) s: $OUT (table: $TABLE)"
[ "$DRY_RUN" = 1 ] || cat "$TABLE"
