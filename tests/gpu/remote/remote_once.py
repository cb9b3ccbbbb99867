"""Run one command remotely against a lease worker on this GPU host: python remote_once.py [--mib N] -- CMD...

For looking into one program: the shim is compiled from this tree, the worker runs the CUDA executor on
GPU --gpu (default 0) with a partition of --mib MiB (default the whole GPU), and the command runs with the shim first on its library path
(add GPUPOOL_SHIM_TRACE=1 to the environment to see every driver call, GPUPOOL_SHIM_PROFILE=1 for a
table of where the client's time went, GPUPOOL_WORKER_PROFILE=DIR for the worker's cProfile). If the
worker dies while the command runs, the command is stopped and the exit status is 3.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))
sys.path.insert(0, str(HERE))

from _pool import nvml_view_env  # noqa: E402
from run import gpus  # noqa: E402

from server.workers import WorkerDevice, start_worker  # noqa: E402
from virtualize.client.remote import fresh_shim, remote_env  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=int, default=0,
                        help="the partition, MiB (default: the whole GPU, as `gpuattach run -n 1` gets it)")  # fmt: skip
    parser.add_argument("--executor", default="cuda", choices=["cuda", "host"])
    parser.add_argument("--gpu", type=int, default=0, help="the GPU, as nvidia-smi numbers it (default 0)")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    root = str(HERE.parents[2])  # the worker process imports server/ from this tree
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
    work = Path(tempfile.mkdtemp(prefix="gpupool-once-"))
    shim = fresh_shim(work / "shim")
    _, uuid, total_mib = gpus()[args.gpu] if args.executor == "cuda" else (0, "", 8192)
    devices = [WorkerDevice(args.gpu, uuid, (args.mib or total_mib) << 20)]
    worker = start_worker("once", devices, bind_host="127.0.0.1", env={}, executor=args.executor)
    answer = {"id": "once", "worker": worker.answer()}
    keep = (
        "GPUPOOL_SHIM_TRACE",
        "GPUPOOL_SHIM_PROFILE",
        "GPUPOOL_SHIM_MEMO",
        "GPUPOOL_DATA_ENCRYPTION",
        "GPUPOOL_SHIM_LANES",
        "GPUPOOL_ISOLATE",
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_") or k in keep}
    env.update(remote_env(answer, cache_root=work / "cache", library=shim))
    if args.executor == "cuda":  # NVML shows the lease's GPU alone, as under gpuattach (torch counts by NVML)
        env.update(nvml_view_env("once", devices, env, work))
    try:
        return run_while_alive(command, env, worker)
    finally:
        time.sleep(0.5)  # the worker writes its profile when it sees the client go
        worker.stop()


WORKER_DIED = 3  # the exit status when the worker died under the command


def run_while_alive(command: list[str], env: dict, worker) -> int:
    """The command's exit status; the command is stopped, and WORKER_DIED returned, if the worker dies
    first: every later call would fail with a lost connection, so a suite's part must not go on with it
    (bench/framework_suites.py then counts the running test as crashed and goes on with a fresh worker)."""
    proc = subprocess.Popen(command, env=env)
    while True:
        try:
            return proc.wait(0.2)
        except subprocess.TimeoutExpired:
            if worker.alive():
                continue
        print(f"remote_once: the lease worker died (exit status {worker.proc.poll()}) under the command; "
              "the command is stopped", file=sys.stderr, flush=True)  # fmt: skip
        proc.kill()
        proc.wait()
        return WORKER_DIED


if __name__ == "__main__":
    sys.exit(main())
