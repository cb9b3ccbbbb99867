"""Plain records the collector hands to its callers (the pool server imports these)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class NvLink:
    """One active NVLink of a GPU, as NVML reports it: NCCL builds its topology from these."""

    link: int  # the link's number on this GPU (0-17 on an H100)
    remote_pci_bus_id: str  # the PCI bus id at the other end: a GPU or an NVSwitch
    version: int | None = None  # NVML's nvmlNvlinkVersion_t (6 = NVLink 4.0); None where NVML does not say


@dataclass(frozen=True)
class GpuInfo:
    """One GPU of this host, as NVML (or the simulated fleet) describes it."""

    index: int
    uuid: str
    name: str
    mem_total_bytes: int
    compute_capability: tuple[int, int]
    driver_version: str
    cuda_version: str
    pci_bus_id: str | None = None  # "00000000:19:00.0", as NVML and cuDeviceGetPCIBusId spell it
    nvlinks: tuple[NvLink, ...] = ()  # its active NVLinks (none without NVLink, or NVML does not say)


@dataclass(frozen=True)
class ProcessActivity:
    """A process holding memory on a GPU and how busy it kept the GPU recently.

    ``sm_util`` is its busy share (ratio 0–1) over the last few seconds, ``0.0`` when the driver saw no
    kernel of it, and ``None`` where the driver does not report per-process utilization (MIG, old GPUs).
    """

    pid: int
    mem_used_bytes: int | None
    sm_util: float | None
