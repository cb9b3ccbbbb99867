"""The slice looks like a GPU to every tool (issue 29), on a GPU host, against a real gpupool-server.

    python tests/gpu/remote/nvml_slice.py     (from the repo root; logs under $OUT if set)

Under `gpuattach run -n 1 -p 0.5` (remote: CUDA through gpupool's libcuda.so.1, NVML through its
libnvidia-ml.so.1, the real GPU hidden from the command) and `gpuattach run --local -p 0.25` (a server
with --mps): the real `nvidia-smi` (table and --query-gpu), pynvml, `nvitop --once`, `gpustat`, PyTorch
(`mem_get_info` total = `get_device_properties().total_memory` = NVML's total = the quota; under
--local through gpupool's libcuda.so.1 interposer, whose path the torch line prints) and JAX with
its default preallocation running a jitted matmul. Tools missing here are skipped and named. Each step
has a timeout; one line per check, PASS / FAIL / SKIP, and a summary; exit status 1 if any failed.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _pool import pool_server

MiB = 1 << 20
RESULTS: list[tuple[str, str, str]] = []
OUT = Path(os.environ.get("OUT") or tempfile.mkdtemp(prefix="nvml-slice-"))


def record(step: str, verdict: str, detail: str = "") -> None:
    RESULTS.append((step, verdict, detail))
    print(f"[{verdict}] {step}: {detail}", flush=True)


def run(cmd: list[str], env: dict, timeout: float = 300) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        return subprocess.CompletedProcess(cmd, 124, exc.stdout or "", f"timed out after {timeout}s")


def slug(label: str) -> str:
    """A file name without spaces or odd characters (the device tool brings only those back)."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", label).strip("_")


def tool_command(name: str) -> list[str] | None:
    """The tool's console script, else `python -m name` (wheels installed into a --target directory
    have no scripts on PATH), else None."""
    if shutil.which(name):
        return [name]
    if importlib.util.find_spec(name):
        return [sys.executable, "-m", name]
    return None


def failure_head(out: subprocess.CompletedProcess, lines: int = 15) -> str:
    """The first lines of a failing tool's stdout and stderr, for the log."""
    head = lambda text: "\n".join((text or "").splitlines()[:lines])  # noqa: E731
    return f"--- stdout (first {lines} lines)\n{head(out.stdout)}\n--- stderr (first {lines} lines)\n{head(out.stderr)}"


def values(out: str) -> dict[str, str]:
    return dict(
        line.split("=", 1) for line in out.splitlines() if "=" in line and " " not in line.split("=")[0]
    )


def native_total() -> int:
    import pynvml as N

    N.nvmlInit()
    total = N.nvmlDeviceGetMemoryInfo(N.nvmlDeviceGetHandleByIndex(0)).total
    N.nvmlShutdown()
    return total


PYNVML = """
import pynvml as N
N.nvmlInit(); h = N.nvmlDeviceGetHandleByIndex(0); m = N.nvmlDeviceGetMemoryInfo(h)
print(f"count={N.nvmlDeviceGetCount()}"); print(f"name={N.nvmlDeviceGetName(h)}"); print(f"total={m.total}")
print(f"used={m.used}"); print(f"v2_total={N.nvmlDeviceGetMemoryInfo(h, version=N.nvmlMemory_v2).total}")
"""

TORCH = """
import torch, pynvml as N
free, total = torch.cuda.mem_get_info(0)
x = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
props = torch.cuda.get_device_properties(0).total_memory
N.nvmlInit(); h = N.nvmlDeviceGetHandleByIndex(0)
print(f"nvml_used_at_once={N.nvmlDeviceGetMemoryInfo(h).used}")  # --local: the host's NVML, live
import os, time; time.sleep(3)  # the NVML view is refreshed every second
print(f"me={os.getpid()}")
m = N.nvmlDeviceGetMemoryInfo(h)
print(f"torch_total={total}"); print(f"props_total={props}"); print(f"nvml_total={m.total}"); print(f"nvml_used={m.used}")
print(f"procs={[p.pid for p in N.nvmlDeviceGetComputeRunningProcesses(h)]}")
try:  # the GPU's SM clock, from the pool server's newest sample (NOT_SUPPORTED before the view carried it)
    print(f"clock={torch.cuda.clock_rate()}")
except N.NVMLError as exc:
    print(f"clock=error:{exc}".replace(" ", "_"))
# which libcuda.so.1 answered: gpupool's remote shim, its --local interposer (and the driver behind it)
print(f"libcuda={sorted({l.split()[-1] for l in open('/proc/self/maps') if 'libcuda' in l or 'localcuda' in l})}".replace(" ", ""))
"""

JAX = """
import jax, jax.numpy as jnp
d = jax.devices()[0]
a = jnp.ones((4096, 4096), jnp.float32)
y = jax.jit(lambda a: (a @ a).sum())(a).block_until_ready()
stats = d.memory_stats() or {}
print(f"platform={d.platform}"); print(f"result={float(y)}"); print(f"bytes_limit={stats.get('bytes_limit')}")
"""


def checks(label: str, attach: list[str], quota: int, env: dict) -> None:
    def near(value: int) -> bool:  # a partition is whole MiB of the GPU's memory
        return abs(value - quota) <= 64 * MiB

    smi = shutil.which("nvidia-smi")
    if smi:
        out = run([*attach, smi], env, 120)
        (OUT / f"nvidia-smi-{slug(label)}.txt").write_text(out.stdout + out.stderr)
        print(out.stdout + out.stderr, flush=True)
        if out.returncode != 0:
            # nvidia-smi prints its table only when every field it needs answered: what it last asked
            # shows with GPUPOOL_SHIM_TRACE=1 (one line per unanswered NVML call)
            traced = run([*attach, smi], {**env, "GPUPOOL_SHIM_TRACE": "1"}, 120)
            (OUT / f"nvidia-smi-{slug(label)}-trace.txt").write_text(traced.stdout + traced.stderr)
            print(failure_head(traced, 60), flush=True)
        record(f"{label} nvidia-smi table", "PASS" if out.returncode == 0 else "FAIL", f"rc {out.returncode}")
        q = run(
            [*attach, smi, "--query-gpu=name,memory.total,memory.used", "--format=csv,noheader,nounits"],
            env,
            120,
        )
        try:
            total = int(q.stdout.strip().splitlines()[0].split(",")[1]) * MiB
            record(
                f"{label} nvidia-smi memory.total",
                "PASS" if near(total) else "FAIL",
                f"{q.stdout.strip()} vs quota {quota // MiB} MiB",
            )
        except (IndexError, ValueError):
            record(f"{label} nvidia-smi --query-gpu", "FAIL", (q.stdout + q.stderr).strip()[-400:])
    else:
        record(f"{label} nvidia-smi", "SKIP", "not installed")
    out = run([*attach, sys.executable, "-c", PYNVML], env)
    got = values(out.stdout)
    ok = out.returncode == 0 and near(int(got.get("total", 0))) and got.get("total") == got.get("v2_total")
    record(f"{label} pynvml", "PASS" if ok else "FAIL", f"{got} {out.stderr.strip()[-300:]}")
    for tool, args in (("nvitop", ["--once"]), ("gpustat", [])):
        cmd = tool_command(tool)
        if cmd is None:
            record(f"{label} {tool}", "SKIP", "not installed (no command, no module)")
            continue
        out = run([*attach, *cmd, *args], env, 120)
        (OUT / f"{tool}-{slug(label)}.txt").write_text(out.stdout + out.stderr)
        print(out.stdout + out.stderr, flush=True)
        if out.returncode != 0:
            print(failure_head(out), flush=True)
        record(
            f"{label} {tool}",
            "PASS" if out.returncode == 0 else "FAIL",
            f"rc {out.returncode} ({' '.join(cmd)})",
        )
    out = run([*attach, sys.executable, "-c", TORCH], env)
    got = values(out.stdout)
    if "No module named 'torch'" in out.stderr:
        record(f"{label} torch", "SKIP", "torch not installed")
    else:
        same = len({got.get("torch_total"), got.get("props_total"), got.get("nvml_total")}) == 1
        ok = (
            out.returncode == 0
            and same
            and near(int(got.get("nvml_total", 0)))
            and int(got.get("nvml_used", 0)) >= 256 * MiB
            and ("--local" not in attach or "localcuda" in got.get("libcuda", ""))
        )
        # --local: used is the host's NVML at the call, so the allocation shows at once and the run's
        # own process is listed (remote: the view, refreshed within about two seconds).
        live = "--local" not in attach or (
            int(got.get("nvml_used_at_once", 0)) >= 256 * MiB
            and got.get("me") in re.findall(r"\d+", got.get("procs", ""))
        )
        record(f"{label} NVML used at once after an allocation", "PASS" if live else "FAIL", f"{got}")
        clock = got.get("clock", "")
        record(f"{label} torch.cuda.clock_rate() = the GPU's SM clock", "PASS" if clock.isdigit() and int(clock) > 0
               else "FAIL", f"clock {clock}")  # fmt: skip
        record(
            f"{label} torch mem_get_info = properties = NVML = quota",
            "PASS" if ok else "FAIL",
            f"{got} {out.stderr.strip()[-400:]}",
        )
    out = run([*attach, sys.executable, "-c", JAX], env, 400)
    got = values(out.stdout)
    if "No module named 'jax'" in out.stderr:
        record(f"{label} jax", "SKIP", "jax not installed")
    else:
        ok = out.returncode == 0 and got.get("result") == str(float(4096**3))
        limit = got.get("bytes_limit")
        fits = limit not in (None, "None") and int(limit) <= quota
        record(f"{label} jax default preallocation + jitted matmul", "PASS" if ok and fits else "FAIL",
               f"{got} quota {quota} {out.stderr.strip()[-600:]}")  # fmt: skip


def main() -> int:
    env = dict(os.environ)
    total = native_total()
    print(f"native GPU 0 memory: {total // MiB} MiB; logs in {OUT}", flush=True)
    try:
        with pool_server(OUT / "remote", env) as attach:
            # The host's own libcuda and libnvidia-ml are shadowed by gpupool's in the command (memory
            # total = the partition proves whose answered). CUDA_VISIBLE_DEVICES stays unset: PyTorch
            # counts devices through NVML and CUDA_VISIBLE_DEVICES, and "" would mean none.
            checks("remote -p 0.5", attach("0.5"), total // 2, env)
    except RuntimeError as exc:
        record("remote server", "FAIL", str(exc))
    try:
        with pool_server(OUT / "local", env, ["--mps"]) as attach:
            checks("local -p 0.25 (MPS)", attach("0.25", "--local"), total // 4, env)
    except RuntimeError as exc:
        # Without MPS CUDA sees the whole GPU (the limit is advisory); NVML still shows the partition.
        record("local server (--mps)", "SKIP", f"{exc}: trying without MPS")
        with pool_server(OUT / "local-nomps", env) as attach:
            checks("local -p 0.25 (no MPS)", attach("0.25", "--local"), total // 4, env)
    failed = [r for r in RESULTS if r[1] == "FAIL"]
    print("\nsummary:", flush=True)
    for step, verdict, _ in RESULTS:
        print(f"  {verdict:4}  {step}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
