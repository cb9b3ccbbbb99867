"""What this server offers: its host (name, address) and its GPUs, from NVML or a simulated fleet.

The real inventory comes from the collector (the one owner of NVML). ``--simulate-gpus SPEC`` builds
a labelled fleet for machines without GPUs (``4xH100-80GB,2xA100-40GB``): the control plane works
the same, every answer says ``"simulated": true``, and remote execution is refused.
"""

from __future__ import annotations

import os
import re
import socket
import uuid as uuidlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

from server._errors import BadRequest
from server.ranges import MAX_GPUS_PER_REQUEST

if TYPE_CHECKING:
    from collector import NvLink

GIB = 1 << 30
MIB = 1 << 20


@dataclass(frozen=True)
class Gpu:
    index: int
    uuid: str
    name: str
    mem_total_bytes: int
    compute_capability: str | None
    driver_version: str | None
    cuda_version: str | None
    pci_bus_id: str | None = None  # the real GPU's (None for simulated ones)
    nvlinks: tuple[NvLink, ...] = ()  # its active NVLinks (none for simulated GPUs)


@dataclass(frozen=True)
class Inventory:
    hostname: str
    addr: str
    gpus: tuple[Gpu, ...]
    simulated: bool

    @property
    def driver_version(self) -> str | None:
        return self.gpus[0].driver_version if self.gpus else None

    @property
    def cuda_version(self) -> str | None:
        return self.gpus[0].cuda_version if self.gpus else None


MAX_SIMULATED_GPUS = MAX_GPUS_PER_REQUEST
MAX_SIMULATED_GIB = 4096  # above any GPU made
_SPEC_ITEM = re.compile(r"^\s*(?:(\d+)\s*x\s*)?([A-Za-z][A-Za-z0-9]*)-(\d+)GB\s*$", re.IGNORECASE)


def parse_simulate_spec(spec: str) -> list[tuple[str, int]]:
    """``4xH100-80GB,2xA100-40GB`` -> [("H100", 80 GiB)] * 4 + [("A100", 40 GiB)] * 2."""
    out: list[tuple[str, int]] = []
    for item in spec.split(","):
        m = _SPEC_ITEM.match(item)
        if not m:
            raise BadRequest(
                f"cannot read simulated GPU spec {item.strip()!r}",
                "write COUNTxMODEL-MEMGB items separated by commas, e.g. 4xH100-80GB,2xA100-40GB",
            )
        count, gib = int(m.group(1) or 1), int(m.group(3))
        if not 1 <= count <= 64:
            raise BadRequest(f"simulated GPU count {count} out of range", "use 1 to 64 GPUs per item")
        if not 1 <= gib <= MAX_SIMULATED_GIB:
            raise BadRequest(
                f"simulated GPU memory {gib}GB out of range", f"use 1 to {MAX_SIMULATED_GIB} GB per GPU"
            )
        out += [(m.group(2).upper(), gib * GIB)] * count
        if len(out) > MAX_SIMULATED_GPUS:
            raise BadRequest(
                f"simulated fleet of more than {MAX_SIMULATED_GPUS} GPUs",
                f"use at most {MAX_SIMULATED_GPUS} GPUs in all",
            )
    return out


def simulated_inventory(spec: str, hostname: str, addr: str) -> Inventory:
    gpus = []
    for index, (model, mem) in enumerate(parse_simulate_spec(spec)):
        # Stable per host and index, so a restarted simulated server keeps its GPUs' identities.
        uid = uuidlib.uuid5(uuidlib.NAMESPACE_DNS, f"gpupool-sim/{hostname}/{index}")
        gpus.append(
            Gpu(
                index=index,
                uuid=f"GPU-{uid}",
                name=f"NVIDIA {model} {mem // GIB}GB (simulated)",
                mem_total_bytes=mem,
                compute_capability="9.0" if model.startswith(("H", "GH", "B")) else "8.0",
                driver_version="550.00-sim",
                cuda_version="12.4",
            )
        )
    return Inventory(hostname=hostname, addr=addr, gpus=tuple(gpus), simulated=True)


def nvml_inventory(hostname: str, addr: str) -> Inventory:
    """The real GPUs (raises collector.NvmlUnavailable with a one-line reason)."""
    from collector import read_inventory

    gpus = []
    for g in visible(read_inventory(), os.environ.get("CUDA_VISIBLE_DEVICES")):
        cc = g.compute_capability
        gpus.append(
            Gpu(
                index=g.index,
                uuid=g.uuid,
                name=g.name,
                mem_total_bytes=g.mem_total_bytes,
                compute_capability=f"{cc[0]}.{cc[1]}" if isinstance(cc, tuple) else (str(cc) if cc else None),
                driver_version=g.driver_version,
                cuda_version=g.cuda_version,
                pci_bus_id=g.pci_bus_id,
                nvlinks=g.nvlinks,
            )
        )
    return Inventory(hostname=hostname, addr=addr, gpus=tuple(gpus), simulated=False)


def visible(gpus, spec: str | None) -> list:
    """The GPUs a server given CUDA_VISIBLE_DEVICES=`spec` owns, as a CUDA program would see them:
    indices or UUIDs (or a UUID's unique beginning), in the order named, the list ending at the first
    entry that names no GPU; None: all. So two servers on one host can each own some of its GPUs."""
    gpus = list(gpus)
    if spec is None:
        return gpus
    chosen = []
    for name in (part.strip() for part in spec.split(",")):
        found = [g for g in gpus if name == str(g.index)] or (
            [g for g in gpus if g.uuid.startswith(name)] if name.startswith(("GPU-", "MIG-")) else []
        )
        if len(found) != 1 or found[0] in chosen:
            break
        chosen.append(found[0])
    return chosen


def default_addr(bind_host: str) -> str:
    """The address clients reach this server at (what ``server.addr`` filters match)."""
    if bind_host not in ("", "0.0.0.0", "::"):
        return bind_host
    try:  # the address of the interface that routes outwards; no packet is sent
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("192.0.2.1", 9))
            return s.getsockname()[0]
    except OSError:
        return "127.0.0.1"
