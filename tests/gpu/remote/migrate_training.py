"""Live migration on a host with two GPUs, in one command: python tests/gpu/remote/migrate_training.py

1. A GPT-2-style training (bench/train_models.py gpt2, seeded, deterministic) runs remotely on a lease
   worker of GPU 0, unmigrated: the reference losses.
2. The same training again on a fresh worker of GPU 0; when it has printed step --at, the lease is asked
   to move to GPU 1 from outside (``WorkerHandle.migrate``: the request gpupool-server's
   ``POST /v1/admin/leases/{id}/migrate`` sends its worker) while the training runs on. Its losses must
   equal the reference step for step.
3. The pause against device memory: a program holding N GiB (filled, checksummed) is moved GPU 0 -> 1
   for each N; the table prints bytes, pause and wait, and the checksum after.

Until the CUDA executor moves leases, every migration here is REFUSED with its reason ("the cuda
executor cannot move a lease to another GPU yet"); the run then checks what must hold anyway: the
lease keeps running and its losses and bytes are unchanged. Each step is bounded by a timeout; the
summary lists PASS / REFUSED / FAIL / SKIP and the exit status is 1 if anything failed. Results go to
$OUT/migrate_results.json when $OUT is set:

    python3 tests/gpu/remote/migrate_training.py 2>&1 | tee $OUT/migrate.log
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path.insert(0, str(ROOT))

from server.workers import WorkerDevice, start_worker  # noqa: E402
from virtualize.client.remote import fresh_shim, remote_env  # noqa: E402

TRAIN_TIMEOUT_S = 900
HOLDER = """
import sys, torch
n = int(sys.argv[1]) << 30
x = torch.empty(n // 4, dtype=torch.float32, device="cuda")
x.copy_(torch.arange(n // 4, dtype=torch.float32, device="cuda") % 9973)
before = float(x.sum())
print("ready", before, flush=True)
sys.stdin.readline()
print("after", float(x.sum()) == before, flush=True)
"""
results: list[dict] = []
CUDA_REFUSAL = "cannot move a lease"


def record(name: str, status: str, detail: str = "") -> None:
    results.append({"check": name, "status": status, "detail": detail})
    print(f"--> {status}: {name}" + (f" ({detail})" if detail else ""), flush=True)


def gpus() -> list[tuple[int, str, int]]:
    out = subprocess.run(["nvidia-smi", "--query-gpu=index,uuid,memory.total", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, timeout=60, check=True).stdout  # fmt: skip
    return [
        (int(i), u.strip(), int(m)) for i, u, m in (line.split(", ") for line in out.strip().splitlines())
    ]


def lease_env(handle, shim: Path, work: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
    env["PYTHONUNBUFFERED"] = "1"
    return {**env, **remote_env({"id": "migrate-test", "worker": handle.answer()}, cache_root=work / "cache",
                                library=shim)}  # fmt: skip


def worker_on(gpu: tuple[int, str, int], mem_gib: int):
    return start_worker("migrate-test", [WorkerDevice(gpu[0], gpu[1], mem_gib << 30)], bind_host="127.0.0.1",
                        env={}, executor="cuda")  # fmt: skip


def train(env: dict[str, str], steps: int, at: int | None, handle, to: int) -> tuple[int, list[float], dict]:
    """Run the training; at step `at` ask for the move (on a thread: the training runs on meanwhile)."""
    cmd = [sys.executable, str(ROOT / "bench" / "train_models.py"), "gpt2", "--steps", str(steps)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    killer = threading.Timer(TRAIN_TIMEOUT_S, proc.kill)
    killer.start()
    losses, answer, asked = [], {}, None
    try:
        for line in proc.stdout:
            if line.startswith("step "):
                losses.append(float(line.split()[3]))
                if at is not None and len(losses) == at and asked is None:
                    asked = threading.Thread(target=lambda: answer.update(handle.migrate(0, to, timeout=300)))
                    asked.start()
        proc.wait()
        if asked is not None:
            asked.join(330)
    finally:
        killer.cancel()
    if proc.returncode:
        print(proc.stderr.read()[-3000:])
    return proc.returncode, losses, answer


def training(shim: Path, work: Path, two: list, steps: int, at: int) -> None:
    print(
        f"\n=== training: gpt2 {steps} steps on GPU {two[0][0]} unmigrated, then moved to GPU {two[1][0]} at step {at}"
    )
    runs = {}
    for label, move_at in (("reference", None), ("migrated", at)):
        handle = worker_on(two[0], 40)
        try:
            started = time.monotonic()
            runs[label] = train(lease_env(handle, shim, work), steps, move_at, handle, two[1][0])
            print(
                f"[{label}] exit {runs[label][0]} in {time.monotonic() - started:.0f} s, {len(runs[label][1])} steps"
            )
        finally:
            handle.stop()
    (ref_rc, ref, _), (rc, moved, answer) = runs["reference"], runs["migrated"]
    print(f"migration answer: {answer}")
    print(f"{'step':>5} {'reference':>12} {'migrated':>12}")
    for i, (a, b) in enumerate(zip(ref, moved, strict=False)):
        if i < 3 or abs(i - at) <= 2 or i == len(ref) - 1:
            print(f"{i:5d} {a:12.5f} {b:12.5f}")
    equal = ref_rc == 0 and rc == 0 and len(ref) == len(moved) == steps and ref == moved
    if not equal:
        record(
            "training losses equal step for step",
            "FAIL",
            f"exit {ref_rc}/{rc}, {len(ref)}/{len(moved)} steps",
        )
    elif answer.get("ok"):
        record("training migrated mid-run, losses equal step for step", "PASS",
               f"GPU {answer['from']} -> {answer['to']}, {answer['bytes'] >> 20} MiB, paused {answer['pause_s']:.3f} s")  # fmt: skip
    elif CUDA_REFUSAL in answer.get("error", ""):
        record("training: migration refused, the lease ran on, losses equal", "REFUSED", answer["error"])
    else:
        record("training migration", "FAIL", str(answer))


def pause_table(shim: Path, work: Path, two: list, sizes: list[int]) -> None:
    print("\n=== pause against device memory")
    rows = []
    for gib in sizes:
        handle = worker_on(two[0], gib + 4)
        try:
            proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(gib)], env=lease_env(handle, shim, work),
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
            try:
                first = proc.stdout.readline()  # the holder filled its memory
                if not first.startswith("ready"):
                    proc.kill()
                    rows.append(
                        (gib, {"ok": False, "error": f"holder failed: {proc.stderr.read()[-500:]}"}, False)
                    )
                    continue
                answer = handle.migrate(0, two[1][0], timeout=300)
                out, _ = proc.communicate("go\n", timeout=120)
                rows.append((gib, answer, "after True" in out))
            finally:
                if proc.poll() is None:
                    proc.kill()
        finally:
            handle.stop()
    print(f"{'GiB':>5} {'moved MiB':>10} {'pause s':>8} {'wait s':>7} {'GB/s':>6}  bytes intact  note")
    for gib, a, intact in rows:
        if a.get("ok"):
            rate = a["bytes"] / a["pause_s"] / 1e9 if a["pause_s"] else 0
            print(
                f"{gib:5d} {a['bytes'] >> 20:10d} {a['pause_s']:8.3f} {a['wait_s']:7.3f} {rate:6.1f}  {intact}"
            )
        else:
            print(f"{gib:5d} {'-':>10} {'-':>8} {'-':>7} {'-':>6}  {intact}  {a.get('error')}")
    for gib, a, intact in rows:
        if not intact:
            record(
                f"pause table {gib} GiB",
                "FAIL",
                "the holder's bytes changed or it failed: " + str(a.get("error", "")),
            )
        elif a.get("ok"):
            record(f"pause table {gib} GiB", "PASS", f"paused {a['pause_s']:.3f} s")
        elif CUDA_REFUSAL in a.get("error", ""):
            record(f"pause table {gib} GiB", "REFUSED", a["error"])
        else:
            record(f"pause table {gib} GiB", "FAIL", str(a))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=60, help="training steps (default 60)")
    parser.add_argument(
        "--at", type=int, default=20, help="the step after which the lease moves (default 20)"
    )
    parser.add_argument("--sizes", default="1,4,16", help="GiB held for the pause table (default 1,4,16)")
    args = parser.parse_args()
    out_dir = Path(os.environ["OUT"]) if os.environ.get("OUT") else None
    work = Path(os.environ.get("TMPDIR", "/tmp")) / f"gpupool-migrate-{os.getpid()}"
    work.mkdir(parents=True, exist_ok=True)
    try:
        found = gpus()
    except (OSError, subprocess.SubprocessError) as exc:
        found = []
        print(f"nvidia-smi failed: {exc}")
    if len(found) < 2:
        record("migration GPU 0 -> GPU 1", "SKIP", f"needs two GPUs, this host has {len(found)}")
    else:
        shim = fresh_shim(work / "shim")
        print(f"shim: {shim}; GPUs: {found[:2]}")
        training(shim, work, found[:2], args.steps, args.at)
        pause_table(shim, work, found[:2], [int(s) for s in args.sizes.split(",")])
    print("\n=== summary")
    for r in results:
        print(f"{r['status']:8} {r['check']}" + (f" ({r['detail']})" if r["detail"] else ""))
    if out_dir is not None:
        (out_dir / "migrate_results.json").write_text(json.dumps(results, indent=1))
    return 1 if any(r["status"] == "FAIL" for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
