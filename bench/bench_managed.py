"""Managed (or mapped) memory remote vs native: python bench/bench_managed.py [--mapped]  (GPU machine, < 1 min)

An iterative numba-cuda program on a `cuda.managed_array` (64 MiB of float32): each step the host
writes one element, a kernel updates the whole array, the host synchronises and reads one element
back — the pattern of issue 11's benchmark ("host touches a little each step"). Run natively (the
driver migrates pages), then remotely with gpupool's libcuda.so.1 and a lease worker on this host
(the shim's mirror: the written 64 KiB chunk goes out before each launch, the read one comes back
after the synchronise). Prints steps per second both ways and remote as % of native; JSON in $OUT.
--mapped: the same on a `cuda.mapped_array` (page-locked host memory the kernel reads over PCIe
natively; remotely the same mirror as managed memory).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REMOTE = ROOT / "tests" / "gpu" / "remote"
sys.path.insert(0, str(REMOTE))
sys.path.insert(0, str(ROOT))

STEPS, N = 300, 16 << 20


def child(mapped: bool) -> None:
    import numpy as np
    from numba import cuda

    @cuda.jit
    def update(x, step):
        i = cuda.grid(1)
        if i < x.size:
            x[i] = x[i] * 0.5 + step

    a = (cuda.mapped_array if mapped else cuda.managed_array)(N, dtype=np.float32)
    a[:] = 1.0
    blocks = (N + 255) // 256
    update[blocks, 256](a, 0.0)  # compile and warm up
    cuda.synchronize()
    checksum = 0.0
    started = time.perf_counter()
    for step in range(STEPS):
        a[(step * 4099) % N] = float(step)  # the host touches one element
        update[blocks, 256](a, float(step))
        cuda.synchronize()
        checksum += float(a[(step * 7919) % N])  # and reads one back
    seconds = time.perf_counter() - started
    print(json.dumps({"steps_per_s": STEPS / seconds, "checksum": checksum}))


def main() -> int:
    mapped = "--mapped" in sys.argv
    if "--child" in sys.argv:
        child(mapped)
        return 0
    from run import base_env, find_shim, gpus, lease_env  # tests/gpu/remote/run.py

    from server.workers import WorkerDevice, start_worker

    work = Path(tempfile.mkdtemp(prefix="gpupool-managed-"))
    site = work / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(  # numba-cuda 0.30 imports numpy.row_stack
        "import numpy\nif not hasattr(numpy, 'row_stack'):\n    numpy.row_stack = numpy.vstack\n"
    )
    env = base_env(site)
    os.environ["PYTHONPATH"] = env["PYTHONPATH"]
    index, uuid, _ = gpus()[0]
    cmd = [sys.executable, __file__, "--child", *(["--mapped"] if mapped else [])]
    native = subprocess.run(cmd, env={**env, "CUDA_VISIBLE_DEVICES": uuid}, capture_output=True, text=True)
    worker = start_worker("bench-managed", [WorkerDevice(index, uuid, 8 << 30)], bind_host="127.0.0.1", env={},
                          executor="cuda")  # fmt: skip
    try:
        remote = subprocess.run(
            cmd, env=lease_env(worker, find_shim(work), work, env), capture_output=True, text=True
        )
    finally:
        worker.stop()
    results = {}
    for label, proc in (("native", native), ("remote", remote)):
        line = next((x for x in proc.stdout.splitlines() if x.startswith("{")), "")
        if proc.returncode or not line:
            print(f"{label} failed (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
            return 1
        results[label] = json.loads(line)
    ratio = results["remote"]["steps_per_s"] / results["native"]["steps_per_s"]
    same = results["remote"]["checksum"] == results["native"]["checksum"]
    kind = "mapped" if mapped else "managed"
    print("| memory | steps/s native | steps/s remote | remote / native | same results |")
    print("| --- | --- | --- | --- | --- |")
    print(f"| {kind} | {results['native']['steps_per_s']:.0f} | {results['remote']['steps_per_s']:.0f} | "
          f"{100 * ratio:.1f} % | {same} |")  # fmt: skip
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], f"{kind}.json").write_text(json.dumps({**results, "ratio": ratio}, indent=2))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
