"""The NVML view of a lease: the file gpupool's ``libnvidia-ml.so.1`` answers from.

`gpuattach run` writes it before the command starts and rewrites it every second from the pool
server's answer for the lease (``GET /v1/leases/ID``: its partitions and their ``usage``); the shim
(``virtualize/client/nvml/nvml_shim.c``) re-reads it whenever it changed. So ``nvidia-smi``, pynvml, nvitop
and gpustat inside the run see the lease's GPUs as the lease has them: memory total = the partition,
used = what the lease holds, utilization = the lease's busy share. See docs/remote.md, "What tools see".

The format is plain text the C side parses without a library, one ``key value`` per line; ``device``
starts a GPU's block and ``process PID BYTES`` and ``nvlink LINK REMOTE_BUS_ID [VERSION]`` lines (the
GPU's active NVLinks, as the server's NVML reports them) belong to the block above them. A key that is
absent means "unknown": the shim then answers that query with NVML_ERROR_NOT_SUPPORTED.

In a --local run (``real_nvml`` names the GPU host's NVML) the ``process`` pids are also the roots of
the run's process tree: the shim answers used memory and the process list from the host's NVML at the
call, for those pids and their descendants, and the bytes here stand only where the host cannot tell.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from server.api import Lease

VIEW_ENV = "GPUPOOL_NVML_VIEW"
HEADER = "gpupool-nvml-view 1"
REFRESH_S = 1.0


def cuda_version_number(text: str | None) -> int | None:
    """ "12.4" -> 12040, as cuDriverGetVersion and nvmlSystemGetCudaDriverVersion count."""
    try:
        major, minor = (text or "").split(".")[:2]
        return int(major) * 1000 + int(minor) * 10
    except ValueError:
        return None


def render(lease: Lease, pids: Sequence[int] = (), real_nvml: Path | None = None) -> str:
    """The view of `lease` (a pool server's lease answer); `pids` are the run's own processes;
    `real_nvml` the GPU host's own NVML, which answers the other queries (--local runs)."""
    from server.api import PartitionUsage

    lines = [HEADER, f"lease {lease.id}"]
    if real_nvml is not None:
        lines.append(f"real_nvml {real_nvml}")
    if driver := lease.server.driver_version:
        lines.append(f"driver_version {driver}")
    if (cuda := cuda_version_number(lease.server.cuda_version)) is not None:
        lines.append(f"cuda_version {cuda}")
    for number, part in enumerate(lease.partitions):
        usage = part.usage if isinstance(part.usage, PartitionUsage) else None  # unasked and unknown alike
        total = int(part.mem_bytes)
        used = min(total, int((usage.mem_used_bytes if usage else None) or 0))
        lines += [
            f"device {number}",
            f"name {part.gpu_name}",
            f"uuid {part.gpu_uuid}",
            f"host_index {part.gpu_index}",
            f"memory_total {total}",
            f"memory_used {used}",
        ]
        if part.pci_bus_id:
            lines.append(f"pci_bus_id {part.pci_bus_id}")
        if part.compute_capability:
            lines.append(f"compute_capability {part.compute_capability}")
        # NCCL reads NVLink from NVML: without these the lease's GPUs look joined by PCI alone.
        lines += nvlink_lines(part.nvlinks)
        if part.sm_share is not None:
            lines.append(f"sm_share_percent {round(part.sm_share * 100)}")
        if usage and usage.util_gpu is not None:
            lines.append(f"util_gpu_percent {round(usage.util_gpu * 100)}")
        if usage and usage.temperature_c is not None:
            lines.append(f"temperature_c {round(usage.temperature_c)}")
        if usage and usage.power_w is not None:
            lines.append(f"power_mw {round(usage.power_w * 1000)}")
        if usage and usage.sm_clock_mhz is not None:
            lines.append(f"sm_clock_mhz {usage.sm_clock_mhz}")
        # What the lease holds, shown as the run's command's: the tools list it as the GPU's process.
        lines += [f"process {pid} {used}" for pid in pids[:1]]
    return "\n".join(lines) + "\n"


def nvlink_lines(nvlinks) -> list[str]:
    """The view's ``nvlink LINK REMOTE_BUS_ID [VERSION]`` lines of a GPU's active NVLinks (each with
    ``link``, ``remote_pci_bus_id`` and ``version``, as the server's NVML read them)."""
    return [
        f"nvlink {nv.link} {nv.remote_pci_bus_id}" + ("" if nv.version is None else f" {nv.version}")
        for nv in nvlinks
    ]


def write(path: Path, text: str) -> None:
    """Replace the view at once: the shim reads either the old view or the new one, never half."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".view.")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


class ViewKeeper:
    """Keeps a run's view current: writes it now, then every REFRESH_S from the server's answer."""

    def __init__(self, client, server, lease: Lease, directory: Path, real_nvml: Path | None = None) -> None:
        self.client, self.server, self.lease = client, server, lease
        self.path = directory / "nvml-view"
        self.real_nvml = real_nvml
        self.pids: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="gpupool-nvml-view")
        write(self.path, render(lease, real_nvml=real_nvml))

    def start(self, pids: list[int]) -> None:
        self.pids = pids
        write(self.path, render(self.lease, pids, self.real_nvml))
        self._thread.start()

    def _run(self) -> None:
        import urllib.parse

        from server.api import Lease

        path = f"/v1/leases/{urllib.parse.quote(self.lease.id)}"
        while not self._stop.wait(REFRESH_S):
            # A missed refresh keeps the last view: the tools show slightly older numbers, nothing fails.
            with contextlib.suppress(Exception):
                self.lease = self.client.call(self.server, "GET", path, Lease)
                write(self.path, render(self.lease, self.pids, self.real_nvml))

    def stop(self) -> None:
        """Stop refreshing, and wait for a refresh under way: its file lands before the run's scratch
        folder is removed."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=1)  # a server that hangs does not hold the run's end longer


class ViewKeepers:
    """The views of a run's leases (one, or one per rank under --spread), started and stopped together."""

    def __init__(self, keepers: Sequence[ViewKeeper]) -> None:
        self.keepers = list(keepers)

    def start(self, pids: list[int]) -> None:
        for keeper in self.keepers:
            keeper.start(pids)

    def stop(self) -> None:
        for keeper in self.keepers:
            keeper.stop()
