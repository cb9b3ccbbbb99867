"""A real gpupool-server on this GPU host for the GPU checks and benchmarks: started on 127.0.0.1 with
its own state directory and a token, stopped (its log tail printed) on exit; and, for leases the checks
start by hand, the NVML view gpuattach would give their programs."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path


def installed() -> tuple[str | None, str | None]:
    """gpupool-server and gpuattach, on PATH or beside this Python."""
    bindir = Path(sys.executable).parent
    return tuple(
        shutil.which(n) or shutil.which(n, path=str(bindir)) for n in ("gpupool-server", "gpuattach")
    )


@contextlib.contextmanager
def pool_server(
    work: Path, env: dict[str, str], extra: list[str] = (), token: str | None = None
) -> Iterator[Callable[..., list[str]]]:
    """Yields attach(fraction) -> the `gpuattach run -n 1 -p F --` command line for this server, with
    attach.url and attach.token (`token`: one made on another server, imported so one token serves both).
    Raises RuntimeError when the server does not come up."""
    server, client = installed()
    if not server or not client:
        raise RuntimeError("gpupool-server / gpuattach not installed")
    state = work / "state"
    state.mkdir(parents=True, exist_ok=True)
    verb = ["import"] if token else ["create"]
    made = subprocess.run([server, "token", *verb, "tester", "--state-dir", str(state)], input=token or "",
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    token = token or next((w for w in made.stdout.split() if w.startswith("gp_")), "")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [server, "serve", "--host", "127.0.0.1", "--port", str(port), "--state-dir", str(state), *extra]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/health", timeout=2)
                break
            except OSError:
                time.sleep(0.5)
        if proc.poll() is not None:
            raise RuntimeError(f"gpupool-server exited with {proc.returncode}")

        def attach(fraction: str, *options: str, n: int = 1) -> list[str]:
            return [client, "run", "--server", f"http://127.0.0.1:{port}", "--token", token, "-n", str(n),
                    "-p", fraction, *options, "--"]  # fmt: skip

        attach.url, attach.token = f"http://127.0.0.1:{port}", token
        yield attach
    finally:
        proc.terminate()
        try:
            out = proc.communicate(timeout=20)[0]
        except subprocess.TimeoutExpired:
            proc.kill()
            out = proc.communicate()[0]
        print("[gpupool-server log tail]\n" + "\n".join(out.splitlines()[-15:]), flush=True)
        if os.environ.get("OUT"):  # the whole log (its workers' lines too) beside the run's other logs
            logs = Path(os.environ["OUT"]) / "logs"
            logs.mkdir(parents=True, exist_ok=True)
            (logs / f"gpupool-server-{port}.log").write_text(out)


def nvml_view_env(name: str, devices, base_env: dict[str, str], work: Path) -> dict[str, str]:
    """What gpuattach adds for a lease's NVML (issue 29), for a lease started by hand from `devices`
    (server.workers.WorkerDevice): PyTorch counts GPUs through NVML, and a lease of one GPU on a host
    of two must not look like two. Merge over `base_env` (it carries the shim's LD_LIBRARY_PATH)."""
    from virtualize.client._nvml_view import HEADER
    from virtualize.client.remote import nvml_env

    known = _gpu_identities()
    lines = [HEADER, f"lease {name}"]
    # As a pool server's lease answer carries it: torch's test suite reads nvidia-smi's driver version
    # (its green-context check), which was "N/A" under a view without it, and stopped collecting.
    driver = _driver_version()
    lines += [f"driver_version {driver}"] * bool(driver)
    for number, d in enumerate(devices):
        bus_id, gpu_name = known.get(d.uuid, ("", ""))
        lines += [f"device {number}", f"uuid {d.uuid}", f"host_index {d.index}",
                  f"memory_total {d.mem_limit_bytes}", "memory_used 0"]  # fmt: skip
        # PyTorch's allocator looks the device up by its PCI bus id when memory runs out.
        lines += [f"pci_bus_id {bus_id}"] * bool(bus_id) + [f"name {gpu_name}"] * bool(gpu_name)
    view = work / f"{name}.nvml-view"
    view.write_text("\n".join(lines) + "\n")
    return nvml_env(view, base_env, cache_root=work / "cache")


def _driver_version() -> str:
    """This host's NVIDIA driver version, from nvidia-smi ("" without it)."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=60, check=True).stdout  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return ""
    return (out.strip().splitlines() or [""])[0].strip()


def _gpu_identities() -> dict[str, tuple[str, str]]:
    """uuid -> (PCI bus id, name) of this host's GPUs, from nvidia-smi ({} without it)."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=uuid,pci.bus_id,name", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=60, check=True).stdout  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return {}
    rows = [[f.strip() for f in line.split(",", 2)] for line in out.strip().splitlines()]
    return {r[0]: (r[1], r[2]) for r in rows if len(r) == 3}
