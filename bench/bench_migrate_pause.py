"""The pause of a move between servers against the connections the lease's memory goes over.

    python bench/bench_migrate_pause.py [--gib 1] [--stripes 1,4] [--repeat 2]

A program under the shim holds --gib GiB on a lease worker of simulated GPU 0 (the host executor: host memory
stands for the device); a receiving worker of GPU 1 waits for it as another gpupool-server starts one
(``--receive``, the one-time secret, TLS as the pool uses it, over loopback); the lease is moved there with
the sending worker's GPUPOOL_MIGRATE_STRIPES set to each of --stripes, --repeat times each; the program checks
its bytes after each move. The table: the pause the worker measured (calls held to calls resumed), the rate
(bytes / pause), intact. On a GPU machine the same table with the CUDA executor comes from
``tests/gpu/remote/migrate_training.py --only xserver_pause --sizes 1,4 --stripes 1,4`` (this script runs its
pause table with a holder the host executor runs). Results as JSON in $OUT/bench_migrate_pause.json when $OUT
is set.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "gpu" / "remote"))

import migrate_training  # noqa: E402
import psutil  # noqa: E402

from virtualize.client.remote import fresh_shim  # noqa: E402

# Holds N MiB (argv[1]) filled with a word, and a page of its own at each of 16 places; after the move, the
# pages and the word between them are as they were ("ready True" / "after True True", as the table wants).
HOLDER = (
    migrate_training.DRIVER_PROLOGUE
    + r"""
ctx, ptr = u64(), u64()
ok(cu.cuInit(0), "init")
ok(cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0), "retain"); ok(cu.cuCtxSetCurrent(ctx), "current")
n = int(sys.argv[1]) << 20
ok(cu.cuMemAlloc_v2(ctypes.byref(ptr), u64(n)), "alloc")
ok(cu.cuMemsetD32_v2(ptr, ctypes.c_uint(0x5A5AA5A5), u64(n // 4)), "fill")
places = [n * i // 16 for i in range(16)]
pages = {at: bytes((at // 4096 + j) % 251 for j in range(4096)) for at in places}
for at, page in pages.items():
    ok(cu.cuMemcpyHtoD_v2(u64(ptr.value + at), page, u64(4096)), "page")
def holds():
    back = ctypes.create_string_buffer(4096)
    for at, page in pages.items():
        ok(cu.cuMemcpyDtoH_v2(back, u64(ptr.value + at), u64(4096)), "read page")
        if back.raw != page:
            return False
        ok(cu.cuMemcpyDtoH_v2(back, u64(ptr.value + at + 4096), u64(4096)), "read between")
        if back.raw != b"\xa5\xa5\x5a\x5a" * 1024:
            return False
    return True
print("ready", holds(), flush=True)
sys.stdin.readline()
print("after", holds(), holds(), flush=True)
"""
)


def busy_cpus_while(send_to):
    """`migrate_training.send_to` that also answers how many of this host's CPUs were busy during the move
    ("cpus_busy": all processes', the other agent's included; near the host's count: the move is CPU-bound)."""

    def measured(source, where, gpu):
        before, started = psutil.cpu_times(), time.monotonic()
        answer = send_to(source, where, gpu)
        after, wall = psutil.cpu_times(), time.monotonic() - started
        busy = sum(after) - after.idle - after.iowait - (sum(before) - before.idle - before.iowait)
        MOVES.append({"stripes": answer.get("stripes"), "pause_s": answer.get("pause_s"),
                      "move_s": round(wall, 3), "cpus_busy": round(busy / wall, 2)})  # fmt: skip
        return answer

    return measured


MOVES: list[dict] = []


def machine() -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())  # fmt: skip
    return f"{os.cpu_count()} CPUs ({cpu}), Python {platform.python_version()}, no GPU (host executor)"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gib", type=int, default=1, help="GiB the program holds (default 1)")
    parser.add_argument("--stripes", default="1,4", help="connections the memory goes over, each a row (1,4)")
    parser.add_argument("--repeat", type=int, default=2, help="moves per number of connections (default 2)")
    args = parser.parse_args()
    stripes = [int(s) for s in args.stripes.split(",")]
    migrate_training.EXECUTOR[0] = "host"
    migrate_training.send_to = busy_cpus_while(migrate_training.send_to)
    migrate_training.BUDGET_S[0] = 3600.0
    out_dir = Path(os.environ["OUT"]) if os.environ.get("OUT") else None
    with tempfile.TemporaryDirectory(prefix="gpupool-bench-migrate-") as tmp:
        work = Path(tmp)
        shim = fresh_shim(work / "shim")
        two = [(0, "", 0), (1, "", 0)]
        started = time.monotonic()
        lines = migrate_training.xserver_pause_table(shim, work, two, [args.gib], None, stripes * args.repeat,
                                                     holder=HOLDER)  # fmt: skip
    print(
        "\n| stripes | pause s | move s (asked to answered) | CPUs busy during the move |\n|---:|---:|---:|---:|"
    )
    for move in MOVES:
        print(
            f"| {move['stripes']} | {move['pause_s']:.3f} | {move['move_s']:.3f} | {move['cpus_busy']:.2f} |"
        )
    print(f"\nmachine: {machine()}; {time.monotonic() - started:.0f} s", flush=True)
    if out_dir is not None:
        (out_dir / "bench_migrate_pause.json").write_text(json.dumps(
            {"machine": machine(), "table": lines, "moves": MOVES, "results": migrate_training.results}, indent=1))  # fmt: skip
    return 0 if all(r["status"] == "PASS" for r in migrate_training.results) else 1


if __name__ == "__main__":
    sys.exit(main())
