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
    """gpupool-server and gpuattach: beside this Python first (a venv's scripts run its packages; one on
    PATH may be another Python's, without cuda-bindings), else on PATH."""
    bindir = Path(sys.executable).parent
    return tuple(
        shutil.which(n, path=str(bindir)) or shutil.which(n) for n in ("gpupool-server", "gpuattach")
    )


@contextlib.contextmanager
def pool_server(
    work: Path,
    env: dict[str, str],
    extra: list[str] = (),
    token: str | None = None,
    host: str = "127.0.0.1",
    prefix: list[str] = (),
) -> Iterator[Callable[..., list[str]]]:
    """Yields attach(fraction) -> the `gpuattach run -n 1 -p F --` command line for this server, with
    attach.url and attach.token (`token`: one made on another server, imported so one token serves both).
    `host`: the address it listens on (its workers too); `prefix`: a command that runs it elsewhere, e.g.
    `ip netns exec NS` (its health is then asked from there). Raises RuntimeError when it does not come up."""
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
    cmd = [*prefix, server, "serve", "--host", host, "--port", str(port), "--state-dir", str(state), *extra]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://{host}:{port}"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            if _healthy(f"{url}/v1/health", prefix):
                break
            time.sleep(0.5)
        if proc.poll() is not None:
            raise RuntimeError(f"gpupool-server exited with {proc.returncode}")

        def attach(fraction: str, *options: str, n: int = 1) -> list[str]:
            return [client, "run", "--server", url, "--token", token, "-n", str(n),
                    "-p", fraction, *options, "--"]  # fmt: skip

        attach.url, attach.token = url, token
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


def _healthy(url: str, prefix: list[str]) -> bool:
    """Whether the server answers its health route (asked from inside `prefix`'s namespace when given)."""
    if not prefix:
        try:
            urllib.request.urlopen(url, timeout=2)
            return True
        except OSError:
            return False
    ask = "import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)"
    return (
        subprocess.run([*prefix, sys.executable, "-c", ask, url], capture_output=True, timeout=30).returncode
        == 0
    )


def nvml_view_env(name: str, devices, base_env: dict[str, str], work: Path) -> dict[str, str]:
    """What gpuattach adds for a lease's NVML (issue 29), for a lease started by hand from `devices`
    (server.workers.WorkerDevice): PyTorch counts GPUs through NVML, and a lease of one GPU on a host
    of two must not look like two. Merge over `base_env` (it carries the shim's LD_LIBRARY_PATH)."""
    from virtualize.client._nvml_view import HEADER
    from virtualize.client.remote import nvml_env

    static = _gpu_facts()
    sensors = _gpu_identities()
    lines = [HEADER, f"lease {name}"]
    # As a pool server's lease answer carries it: torch's test suite reads nvidia-smi's driver version
    # (its green-context check), which was "N/A" under a view without it, and stopped collecting.
    driver = _driver_version()
    lines += [f"driver_version {driver}"] * bool(driver)
    for number, d in enumerate(devices):
        _, _, temperature, power, clock = sensors.get(d.uuid, ("", "", "", "", ""))
        lines += [f"device {number}", f"uuid {d.uuid}", f"host_index {d.index}",
                  f"memory_total {d.mem_limit_bytes}", "memory_used 0"]  # fmt: skip
        # What the server reads of the GPU from NVML (server/_inventory.py), as its lease answer carries it:
        # the PCI bus id (PyTorch's allocator looks the device up by it), the compute capability, and the
        # NVLinks, from which NCCL builds its topology (without them it takes two NVLinked GPUs for PCI
        # ones and picks its shared-memory transport over P2P).
        lines += static.get(d.uuid, [])
        # The sensors as the pool server's lease answer carries them (torch.cuda.temperature() reads one).
        lines += [f"temperature_c {temperature}"] * temperature.isdigit()
        lines += [f"power_mw {round(float(power) * 1000)}"] * _number(power)
        lines += [f"sm_clock_mhz {clock}"] * clock.isdigit()  # torch.cuda.clock_rate() reads it
    view = work / f"{name}.nvml-view"
    view.write_text("\n".join(lines) + "\n")
    return nvml_env(view, base_env, cache_root=work / "cache")


def _gpu_facts() -> dict[str, list[str]]:
    """uuid -> the view's lines of what does not change (name, PCI bus id, compute capability, NVLinks), read
    through NVML as a pool server reads them ({} without NVML)."""
    from collector import NvmlUnavailable, read_inventory
    from virtualize.client._nvml_view import nvlink_lines

    try:
        gpus = read_inventory()
    except NvmlUnavailable:
        return {}
    facts = {}
    for g in gpus:
        cc = g.compute_capability
        lines = [f"name {g.name}"] + [f"pci_bus_id {g.pci_bus_id}"] * bool(g.pci_bus_id)
        lines += [f"compute_capability {cc[0]}.{cc[1]}"] * bool(cc and cc[0])
        lines += nvlink_lines(g.nvlinks)
        facts[g.uuid] = lines
    return facts


def _driver_version() -> str:
    """This host's NVIDIA driver version, from nvidia-smi ("" without it)."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=60, check=True).stdout  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return ""
    return (out.strip().splitlines() or [""])[0].strip()


def _number(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


def _gpu_identities() -> dict[str, tuple[str, str, str, str, str]]:
    """uuid -> (PCI bus id, name, temperature °C, power W, SM clock MHz) of this host's GPUs, from nvidia-smi
    ({} without it; a sensor it cannot read is "[N/A]")."""
    try:
        query = "--query-gpu=uuid,pci.bus_id,temperature.gpu,power.draw,clocks.sm,name"
        out = subprocess.run(["nvidia-smi", query, "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=60, check=True).stdout  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return {}
    rows = [[f.strip() for f in line.split(",", 5)] for line in out.strip().splitlines()]  # the name last
    return {r[0]: (r[1], r[5], r[2], r[3], r[4]) for r in rows if len(r) == 6}
