"""PyTorch's patterns of issue 31, native vs remote, in one run: python bench/bench_torch_patterns.py

GPU machine (PyTorch; Triton for `do_bench`). Each pattern runs in a child process twice — natively,
then with gpupool's libcuda.so.1 talking to a lease worker on GPU 0 (CUDA executor) over its local
socket (`--tcp`: loopback TCP, `--encrypt`: TLS 1.3, as a client on another host) — and the table
shows remote as % of native. With `--profile` the remote run of each pattern writes where its time
went: the shim's per-call profile (GPUPOOL_SHIM_PROFILE) and the worker's cProfile, under $OUT.

  graphed_mlp     training steps/s of a small MLP under torch.cuda.make_graphed_callables
  do_bench        triton.testing.do_bench of a 1000 x 1000 fp32 matmul (ms, lower is better)
  pinned_dtoh     tensor copies into page-locked memory, non_blocking, 16 in flight, 64 KiB / 1 MiB /
                  16 MiB (GB/s), as metrics and outputs leave the GPU
  pinned_htod     a data loader's pinned batches to the GPU, non_blocking, 16 in flight over 4
                  streams, same sizes (GB/s)
  small_copies    synchronous copies 4 KiB / 64 KiB / 1 MiB each way from pageable memory (GB/s)
  generate        greedy decoding with the KV cache, a GPT-2-size model (transformers, random weights),
                  64 new tokens after a 32-token prompt, batch 1 and batch 32 (tokens/s), as an
                  inference server decodes

The rates of these patterns move by tens of percent between runs of the same program a minute apart (the
graphed MLP's native rate 1,162-1,845 steps/s on one H200), so `--rounds N` runs native and remote in turn
N times each and reports the medians, with the range of the rounds' remote-to-native ratios.

Each child is bounded by --timeout seconds; a pattern that fails or is missing a library (Triton)
is reported as such and the others still run. Results: the table on stdout, JSON in $OUT.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SIZES = (64 << 10, 1 << 20, 16 << 20)
SMALL = (4 << 10, 64 << 10, 1 << 20)
# pattern -> (unit, higher is better)
PATTERNS = {
    "graphed_mlp": ("steps/s", True),
    "do_bench": ("ms", False),
    "pinned_dtoh": ("GB/s", True),
    "pinned_htod": ("GB/s", True),
    "small_copies": ("GB/s", True),
    "generate": ("tokens/s", True),
}
NEW_TOKENS = 64


# ---- the measured patterns (in a child process, natively or remotely) ----------------------------


def graphed_mlp(torch) -> dict:
    model = torch.nn.Sequential(
        torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024), torch.nn.ReLU(),
        torch.nn.Linear(1024, 10),
    ).cuda()  # fmt: skip
    loss_fn = torch.nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(256, 512, device="cuda"), torch.randint(0, 10, (256,), device="cuda")
    graphed = torch.cuda.make_graphed_callables(model, (x,))

    def step():
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(graphed(x), y)
        loss.backward()
        optimizer.step()

    for _ in range(20):
        step()
    torch.cuda.synchronize()
    n = 500
    t = time.perf_counter()
    for _ in range(n):
        step()
    torch.cuda.synchronize()
    return {"": n / (time.perf_counter() - t)}


def do_bench(torch) -> dict:
    from triton.testing import do_bench as bench

    a, b = torch.randn(1000, 1000, device="cuda"), torch.randn(1000, 1000, device="cuda")
    return {"": statistics.median(bench(lambda: a @ b) for _ in range(5))}


def pinned_dtoh(torch) -> dict:
    rows = {}
    for size in SIZES:
        src = torch.ones(size, dtype=torch.uint8, device="cuda")
        outs = [torch.empty(size, dtype=torch.uint8, pin_memory=True) for _ in range(16)]
        rates = []
        for _ in range(max(3, min(30, (256 << 20) // (16 * size)))):
            t = time.perf_counter()
            for out in outs:
                out.copy_(src, non_blocking=True)
            torch.cuda.synchronize()
            rates.append(16 * size / (time.perf_counter() - t) / 1e9)
        rows[label(size)] = statistics.median(rates)
    return rows


def pinned_htod(torch) -> dict:
    streams = [torch.cuda.Stream() for _ in range(4)]
    rows = {}
    for size in SIZES:
        batches = [torch.ones(size, dtype=torch.uint8, pin_memory=True) for _ in range(16)]
        dst = [torch.empty(size, dtype=torch.uint8, device="cuda") for _ in range(16)]
        rates = []
        for _ in range(max(3, min(30, (256 << 20) // (16 * size)))):
            t = time.perf_counter()
            for k, (batch, d) in enumerate(zip(batches, dst, strict=True)):
                with torch.cuda.stream(streams[k % 4]):
                    d.copy_(batch, non_blocking=True)
            torch.cuda.synchronize()
            rates.append(16 * size / (time.perf_counter() - t) / 1e9)
        rows[label(size)] = statistics.median(rates)
    return rows


def small_copies(torch) -> dict:
    rows = {}
    for size in SMALL:
        host = torch.ones(size, dtype=torch.uint8)
        dev = torch.empty(size, dtype=torch.uint8, device="cuda")
        for name, copy in (
            ("HtoD", lambda h=host, d=dev: d.copy_(h)),
            ("DtoH", lambda h=host, d=dev: h.copy_(d)),
        ):
            copy()
            times = []
            for _ in range(200):
                t = time.perf_counter()
                copy()
                torch.cuda.synchronize()
                times.append(time.perf_counter() - t)
            rows[f"{name} {label(size)}"] = size / statistics.median(times) / 1e9
    return rows


def generate(torch) -> dict:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config()).cuda().eval()  # GPT-2's 124 M parameters, random weights
    # greedy, with the KV cache, exactly NEW_TOKENS each (random weights may say end-of-text early)
    options = dict(max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False, use_cache=True,
                   pad_token_id=0)  # fmt: skip
    rows = {}
    for batch in (1, 32):
        prompt = torch.randint(0, model.config.vocab_size, (batch, 32), device="cuda")
        with torch.no_grad():
            model.generate(prompt, **options)  # warm-up: kernels chosen, caches allocated
            torch.cuda.synchronize()
            t = time.perf_counter()
            model.generate(prompt, **options)
            torch.cuda.synchronize()
        rows[f"batch {batch}"] = batch * NEW_TOKENS / (time.perf_counter() - t)
    return rows


def label(size: int) -> str:
    return f"{size >> 20} MiB" if size >= 1 << 20 else f"{size >> 10} KiB"


def child(pattern: str) -> None:
    import torch

    torch.cuda.init()
    print(json.dumps(globals()[pattern](torch)))


# ---- the driver ----------------------------------------------------------------------------------


def run(pattern: str, env: dict[str, str], timeout: float, profile: Path | None = None) -> dict | str:
    """A pattern's results, or why there are none (one line)."""
    try:
        proc = subprocess.run([sys.executable, __file__, "--child", pattern], env=env, capture_output=True,
                              text=True, timeout=timeout)  # fmt: skip
    except subprocess.TimeoutExpired:
        return f"timed out after {timeout:.0f} s"
    if profile is not None:
        profile.write_text(proc.stderr)
    if proc.returncode != 0:
        lines = proc.stderr.strip().splitlines() or ["no output"]
        # the exception's own line, not the last of a traceback torch appends to it
        errors = [line for line in lines if "Error" in line.split(":", 1)[0]]
        return f"failed ({proc.returncode}): {(errors or lines)[-1].strip()[:300]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--patterns", default=",".join(PATTERNS),
                        help=f"comma-separated, default all: {','.join(PATTERNS)}")  # fmt: skip
    parser.add_argument("--tcp", action="store_true", help="loopback TCP, not the worker's local socket")
    parser.add_argument(
        "--encrypt", action="store_true", help="TLS 1.3 on the data connection, as across hosts"
    )
    parser.add_argument("--profile", action="store_true", help="the remote runs' profiles under $OUT")
    parser.add_argument("--timeout", type=float, default=300, help="seconds per child run (default 300)")
    parser.add_argument(
        "--partition-mib", type=int, default=16384, help="memory of the lease (default 16384)"
    )
    parser.add_argument("--rounds", type=int, default=1,
                        help="native and remote runs in turn per pattern; medians reported (default 1)")  # fmt: skip
    args = parser.parse_args()
    sys.stdout.reconfigure(line_buffering=True)  # the rows reach a log as they are printed
    if args.rounds < 1:
        print("bench_torch_patterns: --rounds must be at least 1", file=sys.stderr)
        return 2
    if args.child:
        child(args.child)
        return 0
    chosen = args.patterns.split(",")
    unknown = [p for p in chosen if p not in PATTERNS]
    if unknown:
        print(f"bench_torch_patterns: unknown pattern {unknown[0]!r}\n  hint: choose from {', '.join(PATTERNS)}",
              file=sys.stderr)  # fmt: skip
        return 2

    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "tests" / "gpu" / "remote"))
    from _pool import nvml_view_env  # NVML shows the lease's GPU alone, as under gpuattach

    from server.workers import WorkerDevice, start_worker
    from virtualize.client.remote import fresh_shim, remote_env
    from virtualize.common import _wire

    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="gpupool-bench-torch-"))
    out_dir = Path(os.environ.get("OUT") or work)
    shim = fresh_shim(work / "shim")
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_") or k.startswith("GPUPOOL_SHIM_")
    }
    env["PYTHONPATH"] = os.environ["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(ROOT), env.get("PYTHONPATH")])
    )
    try:
        uuid = subprocess.run(["nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader", "-i", "0"],
                              capture_output=True, text=True, check=True, timeout=30).stdout.strip()  # fmt: skip
    except (OSError, subprocess.SubprocessError) as exc:
        print(f"bench_torch_patterns: no GPU here ({exc})\n  hint: run it on a GPU machine", file=sys.stderr)
        return 1
    worker_env = {"GPUPOOL_WORKER_PROFILE": str(out_dir)} if args.profile else {}
    results: dict[str, dict] = {}
    for pattern in chosen:
        devices = [WorkerDevice(0, uuid, args.partition_mib << 20)]
        worker = start_worker("bench-torch", devices, bind_host="127.0.0.1", env=worker_env, executor="cuda")
        rounds: list[tuple] = []
        try:
            remote_vars = {**env, **remote_env({"id": "bench-torch", "worker": worker.answer()},
                                               cache_root=work / "cache", library=shim)}  # fmt: skip
            remote_vars.update(nvml_view_env("bench-torch", devices, remote_vars, work))
            if args.encrypt:
                remote_vars["GPUPOOL_DATA_ENCRYPTION"] = "always"
            if args.tcp:
                remote_vars.pop(_wire.ENV_LOCAL, None)
            profile = None
            if args.profile:
                remote_vars[_wire.ENV_PROFILE] = "1"
                profile = out_dir / f"torch-{pattern}-shim-profile.txt"
            for k in range(args.rounds):
                turn = f" (round {k + 1} of {args.rounds})" if args.rounds > 1 else ""
                print(f"{pattern}: native ...{turn}", flush=True)
                native = run(pattern, env, args.timeout)
                print(f"{pattern}: remote ...{turn}", flush=True)
                rounds.append((native, run(pattern, remote_vars, args.timeout, profile)))
                time.sleep(0.5 if args.profile else 0)  # the worker writes its profile when the client goes
                if any(isinstance(r, str) for r in rounds[-1]):
                    break  # a failure is the pattern's answer
        finally:
            worker.stop()
        results[pattern] = combine(rounds, PATTERNS[pattern][1])
        # Each pattern's rows and JSON as it ends: a run cut short by a time limit keeps what it measured.
        if len(chosen) > 1:
            report({pattern: results[pattern]})
        save(results, args, started)
    report(results)
    return 0


def save(results: dict, args, started: float) -> None:
    """The results so far as JSON in $OUT (bench_torch_patterns.json), with the transport and the time taken."""
    if os.environ.get("OUT"):
        transport = "tls" if args.encrypt else "tcp" if args.tcp else "local socket"
        whole = {**results, "transport": transport, "seconds": time.monotonic() - started}
        Path(os.environ["OUT"], "bench_torch_patterns.json").write_text(json.dumps(whole, indent=2))


def percent(native: float, remote: float, higher: bool) -> float:
    return (remote / native if higher else native / remote) * 100


def combine(rounds: list[tuple], higher: bool) -> dict:
    """Several rounds' (native, remote) results as one: each measure's median, and the range of the rounds'
    remote-as-%-of-native; a round that failed is the answer."""
    for native, remote in rounds:
        if isinstance(native, str) or isinstance(remote, str):
            return {"native": native, "remote": remote}
    natives, remotes = [n for n, _ in rounds], [r for _, r in rounds]
    both = {"native": {k: statistics.median(n[k] for n in natives) for k in natives[0]},
            "remote": {k: statistics.median(r[k] for r in remotes if r.get(k)) for k in natives[0]
                       if all(r.get(k) for r in remotes)}}  # fmt: skip
    if len(rounds) > 1:
        both["rounds"] = {k: [round(percent(n[k], r[k], higher)) for n, r in rounds] for k in both["remote"]}
    return both


def report(results: dict) -> None:
    print("\n| pattern | native | remote | remote as % of native |")
    print("| --- | --- | --- | --- |")
    for pattern, both in results.items():
        unit, higher = PATTERNS[pattern]
        native, remote = both["native"], both["remote"]
        if isinstance(native, str) or isinstance(remote, str):
            why = native if isinstance(native, str) else remote
            print(f"| {pattern} | {native if isinstance(native, str) else '-'} | {why} | - |")
            continue
        for key, n in native.items():
            r = remote.get(key)
            name = f"{pattern} {key}".strip()
            if not r or not n:
                print(f"| {name} | {n:.3f} {unit} | {r} | - |")
                continue
            spread = both.get("rounds", {}).get(key)
            each = f" (rounds {min(spread)}-{max(spread)} %)" if spread else ""
            print(f"| {name} | {n:.3f} {unit} | {r:.3f} {unit} | {percent(n, r, higher):.0f} %{each} |")


if __name__ == "__main__":
    sys.exit(main())
