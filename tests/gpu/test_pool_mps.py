"""The pool on a real GPU with MPS: partitions enforced, four quarter-leases sharing one GPU, idle reclaim.

Run on a GPU host (Python 3.12, torch, aiohttp, psutil, msgspec, pyarrow), from the repository root:

    python -m pytest tests/gpu/test_pool_mps.py -v -s

It starts `gpupool-server --mps` on 127.0.0.1 (it starts its own MPS control daemon under a temporary
state directory and stops it at the end) and drives it with `gpuattach run --local`. About 2 minutes.
The GEMM numbers are printed as a Markdown table for bench/RESULTS.md.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from pool_harness import ROOT, ServerProc, api, client_env, gpuattach, gpuattach_cmd

HERE = Path(__file__).resolve().parent
PY = sys.executable
pytestmark = [pytest.mark.gpu, pytest.mark.timeout(290)]

CONFIG = """
[policy]
reap_interval = 0.5
activity_window = "2s"
sample_interval = "2s"
telemetry_flush = "2s"
[clients.gpuidle]
idle_timeout = "8s"
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    base = tmp_path_factory.mktemp("mps")
    tel = base / "telemetry"
    extra = ["--mps", "--telemetry", str(tel)]
    if Path("/tmp/nvidia-mps/control").exists():  # an MPS daemon already runs with the default pipe: join it
        extra += ["--mps-pipe-dir", "/tmp/nvidia-mps"]
    srv = ServerProc(base / "state", gpus=None, config=CONFIG, extra=tuple(extra)).start(timeout=90)
    srv.telemetry = tel
    yield srv
    srv.stop()


def _env(server, tmp_path, client):
    return client_env(tmp_path, [server.url], server.token(client))


def _json_line(stdout: str) -> dict:
    return json.loads([line for line in stdout.splitlines() if line.startswith("{")][-1])


def test_partition_memory_limit_is_enforced_for_pytorch(server, tmp_path):
    env = _env(server, tmp_path, "alloc")
    out = gpuattach(
        "run",
        "--local",
        "-n",
        "1",
        "-p",
        "0.25",
        "--",
        PY,
        str(HERE / "pool_mps_alloc.py"),
        env=env,
        timeout=120,
    )
    print(out.stdout, out.stderr)
    assert out.returncode == 0, out.stderr
    assert "advisory" not in out.stderr  # MPS enforces it
    r = _json_line(out.stdout)
    assert r["mps_limit_env"] and r["mps_limit_env"].startswith("0=")
    assert r["alloc_70pct_ok"] is True, r
    assert r["alloc_130pct_ok"] is False, r  # refused beyond the partition


def _gemm(env, *args, start_at=0.0, seconds=15.0):
    cmd = [*gpuattach_cmd(), "run", "--local", "-n", "1", *args, "--", PY, str(HERE / "pool_mps_gemm.py"),
           "--start-at", str(start_at), "--seconds", str(seconds)]  # fmt: skip
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)


def test_four_quarter_leases_share_the_gpu(server, tmp_path):
    env = _env(server, tmp_path, "gemm")
    start_at = time.time() + 25  # every copy initialises CUDA first, then all measure the same window
    procs = [_gemm(env, "-p", "0.25", start_at=start_at) for _ in range(4)]
    four = []
    for p in procs:
        out, err = p.communicate(timeout=150)
        assert p.returncode == 0, err
        four.append(_json_line(out)["tflops"])
    single_p = _gemm(env, "-p", "1")
    out, err = single_p.communicate(timeout=120)
    assert single_p.returncode == 0, err
    single = _json_line(out)["tflops"]
    share_p = _gemm(env, "-p", "0.25", "--sm-share", "0.25")
    out, err = share_p.communicate(timeout=120)
    assert share_p.returncode == 0, err
    shared = _json_line(out)
    gpu = subprocess.run(
        ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader", "-i", "0"], capture_output=True, text=True
    ).stdout.strip()
    print(
        "\n| GPU | 4 × 0.25 leases at once (each) | sum | 1 × whole GPU | sum / whole | 1 × 0.25 with --sm-share 0.25 |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    print(f"| {gpu} | {', '.join(f'{t:.0f}' for t in four)} TFLOP/s | {sum(four):.0f} TFLOP/s | {single:.0f} TFLOP/s | "
          f"{sum(four) / single:.2f} | {shared['tflops']:.0f} TFLOP/s (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={shared['sm_pct']}) |")  # fmt: skip
    assert shared["sm_pct"] == "25"
    assert sum(four) > 0.5 * single  # sharing one GPU four ways keeps most of its throughput
    assert shared["tflops"] < 0.6 * single  # the SM share limits a lease's compute


def test_idle_gpu_lease_is_reclaimed_and_a_busy_one_is_not(server, tmp_path):
    env = _env(server, tmp_path, "gpuidle")  # idle timeout 8 s for this client
    out = gpuattach("run", "--local", "-n", "1", "-p", "0.1", "--", PY, str(HERE / "pool_idle_probe.py"), "busy", "--seconds", "16",
                    env=env, timeout=120)  # fmt: skip
    assert out.returncode == 0 and "finished" in out.stdout, out.stderr
    out = gpuattach("run", "--local", "-n", "1", "-p", "0.1", "--", PY, str(HERE / "pool_idle_probe.py"), "idle", "--seconds", "60",
                    env=env, timeout=120)  # fmt: skip
    assert "was reclaimed: idle for" in out.stderr, out.stderr
    assert "finished" not in out.stdout


def test_pool_events_and_gpu_samples_written(server, tmp_path):
    import pyarrow.dataset as ds

    time.sleep(5)  # one more flush interval
    events = (
        ds.dataset(server.telemetry / "pool_events", format="parquet", partitioning="hive")
        .to_table()
        .to_pylist()
    )
    kinds = {e["event"] for e in events}
    assert {"grant", "release"} <= kinds and all(e["simulated"] is False for e in events)
    samples = ds.dataset(server.telemetry / "gpu_samples", format="parquet", partitioning="hive").to_table()
    assert samples.num_rows > 0
    _, gpus = api(server.url, "GET", "/v1/gpus", server.token("smi"))
    live = gpus["gpus"][0]["live"]  # what gpuattach smi shows as GPU-Util / Mem-Used
    assert live["state"] == "ok" and live["mem_used_bytes"] > 0 and live["util_gpu_mean"] is not None
