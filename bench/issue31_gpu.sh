#!/usr/bin/env bash
# Issue 31's measurements on a GPU machine, native vs remote in each run, results and profiles under $OUT:
#   OUT=/some/dir bash bench/issue31_gpu.sh
# 1. bench_remote.py, every pattern, over the worker's local socket (page-locked memory shared) and over
#    loopback TLS (as a client on another host); each pattern alone with its profile of the remote run.
# 2. The page-locked copies with the sharing off (GPUPOOL_SHIM_SHARED_PINNED=0): the "before".
# 3. bench_torch_patterns.py (PyTorch: make_graphed_callables, do_bench, pinned non_blocking copies,
#    small copies), local socket and TLS, with profiles.
# Each step is bounded by `timeout`; a failing step is reported and the next one runs.
set -u
: "${OUT:?set OUT to a folder for the results}"
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
step() { # name, seconds, command...
    local name=$1 seconds=$2
    shift 2
    mkdir -p "$OUT/$name"
    echo "== $name: $*"
    OUT="$OUT/$name" timeout "$seconds" "$@" >"$OUT/$name/stdout.txt" 2>"$OUT/$name/stderr.txt"
    local rc=$?
    grep '^|' "$OUT/$name/stdout.txt" || tail -5 "$OUT/$name/stderr.txt"
    [ "$rc" -eq 0 ] || echo "!! $name ended with status $rc (see $OUT/$name/stderr.txt)"
}
step local 600 "$PY" bench/bench_remote.py
step tls 600 "$PY" bench/bench_remote.py --tcp --encrypt
step shared_pinned_off 300 env GPUPOOL_SHIM_SHARED_PINNED=0 "$PY" bench/bench_remote.py --patterns dtoh_async,htod_async
for pattern in round_trip launches copies dtoh_async htod_async launch_bound graph events; do
    step "profile_local_$pattern" 300 "$PY" bench/bench_remote.py --patterns "$pattern" --profile
done
step torch_local 900 "$PY" bench/bench_torch_patterns.py --profile
step torch_tls 900 "$PY" bench/bench_torch_patterns.py --tcp --encrypt --profile
step torch_shared_pinned_off 600 env GPUPOOL_SHIM_SHARED_PINNED=0 "$PY" bench/bench_torch_patterns.py \
    --patterns pinned_dtoh,pinned_htod
echo "== done: $OUT"
