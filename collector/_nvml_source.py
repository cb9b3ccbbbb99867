"""Sample this host's GPUs through NVML, one tick at a time.

What a tick costs (H100 figures from DESIGN.md) shapes what it reads:

- utilization.gpu and memory-controller utilization come from the driver's sample ring
  (``nvmlDeviceGetSamples``), summarised per tick as mean and max, so the ~200 ms driver samples
  between two ticks are all counted rather than one of them picked. A ring read costs ~1-2 ms of CPU
  (measured on an H200: bench/nvml_call_costs.py), far more than every other per-tick query together,
  so the rings (and the per-process busy-share ring) are read only every ``ring_every_s`` and each
  tick's samples are sorted into it by their timestamps. By default that is 60 % of the history the
  ring holds (measured at start: 71 samples over 14 s on an H200, so every 8.4 s), at most 10 s, at
  least one tick: no sample is lost between reads, even with a late tick. A GPU's rows therefore leave
  the source in batches, up to ``ring_every_s`` late; ``drain()`` hands out the last batch when the
  collector stops;
- memory, power, temperature, SM clock: microseconds each, every tick;
- GPM (Hopper+): one ~39 µs sample per tick, metrics computed between consecutive samples at least
  100 ms apart (NVML's minimum);
- the energy counter costs ~4 ms, so it is read once a minute and null on other ticks;
- per process: memory and busy share (``nvmlDeviceGetProcessUtilization`` since the previous tick),
  with user and container id from /proc.

A GPU that stops answering is recorded with ``state='lost'`` and the others keep being sampled; it is
re-probed every ``lost_retry_s``.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import time
from typing import Any, Protocol

from collector._errors import GpuLost, NvmlUnavailable
from collector._inventory import clock_offset_us, inventory_from, ring_span_s
from collector._procinfo import ProcessInfo
from collector._source import Tick, now_us
from collector._types import GpuInfo


class NvmlApi(Protocol):
    """What NvmlSource needs from NVML: ``collector._nvml.NvmlBackend``, or a fake in tests."""

    def start(self) -> None: ...
    def stop(self) -> None: ...
    def driver_version(self) -> str: ...
    def cuda_version(self) -> str: ...
    def device_count(self) -> int: ...
    def uuid(self, index: int) -> str | None: ...
    def name(self, index: int) -> str | None: ...
    def compute_capability(self, index: int) -> tuple[int, int] | None: ...
    def memory(self, index: int) -> tuple[int, int] | None: ...
    def power_w(self, index: int) -> float | None: ...
    def temperature_c(self, index: int) -> float | None: ...
    def sm_clock_hz(self, index: int) -> float | None: ...
    def utilization_samples(self, index: int, kind: str, since_us: int) -> list[tuple[int, float]] | None: ...
    def utilization_rates(self, index: int) -> tuple[float, float] | None: ...
    def energy_j(self, index: int) -> float | None: ...
    def processes(self, index: int) -> list[tuple[int, int | None]] | None: ...
    def process_utilization(self, index: int, since_us: int) -> list[tuple[int, int, float]] | None: ...
    def gpm_supported(self, index: int) -> bool: ...
    def gpm_sample(self, index: int) -> Any | None: ...
    def gpm_free(self, sample: Any) -> None: ...
    def gpm_metrics(self, older: Any, newer: Any) -> dict[str, float | None]: ...


GPM_COLUMNS = ("sm_activity", "sm_occupancy", "tensor_activity", "dram_bw_util")
RING_EVERY_MAX_S = 10.0  # rows wait at most this long for their ring read
RING_EVERY_DEFAULT_S = 5.0  # where the ring's depth cannot be measured at start


def _summary(samples: list[tuple[int, float]]) -> tuple[float, float]:
    values = [v for _, v in samples]
    return sum(values) / len(values) / 100.0, max(values) / 100.0


class _GpuState:
    """What the source remembers about one GPU between ticks."""

    def __init__(self, info: GpuInfo, gpm: bool):
        self.info = info
        # Driver samples newer than these (NVML's clock) belong to the next tick; set at the first tick.
        self.util_since_us: int | None = None
        self.mem_since_us: int | None = None
        self.proc_since_us: int | None = None
        self.gpm = gpm
        self.gpm_prev: Any | None = None
        self.gpm_prev_at = 0.0
        self.energy_at: float | None = None  # monotonic time of the last energy read
        # Ticks whose rows wait for the next ring read: (gpu row, process rows, start µs, end µs].
        self.pending: list[tuple[dict, list[dict], int, int]] = []
        self.tick_end_us: int | None = None
        self.ring_read_at: float | None = None  # monotonic time of the last ring read
        # The newest ring sample seen, per kind: what a tick with no sample of its own carries forward.
        self.last_sample: dict[str, float] = {}
        self.lost_since: float | None = None
        self.lost_probe_at = 0.0


class NvmlSource:
    kind = "nvml"
    simulated = False

    def __init__(
        self,
        backend: NvmlApi | None = None,
        *,
        interval_s: float = 1.0,
        energy_every_s: float = 60.0,
        gpm_min_gap_s: float = 0.1,
        lost_retry_s: float = 30.0,
        ring_every_s: float | None = None,
        procinfo: ProcessInfo | None = None,
        clock=time.monotonic,
        wall_us=None,
    ):
        if backend is None:
            from collector._nvml import NvmlBackend

            backend = NvmlBackend()
        self._backend = backend
        self._wall_us = wall_us or now_us
        self._clock = clock
        self._energy_every_s = energy_every_s
        self._gpm_min_gap_s = gpm_min_gap_s
        self._lost_retry_s = lost_retry_s
        self._procinfo = procinfo or ProcessInfo()
        backend.start()  # raises NvmlUnavailable
        # Inside a gpupool lease NVML shows the lease's slices: their rows say so (source "lease"),
        # so no reader counts them as this machine's own GPUs.
        if getattr(backend, "lease", lambda: None)():
            self.kind = "lease"
        self._inventory = inventory_from(backend)
        # GPUs NVML counts but that did not answer at start (lost before we came): reported, not sampled.
        self.unanswered = sorted(set(range(backend.device_count())) - {g.index for g in self._inventory})
        if not self._inventory:
            backend.stop()
            raise NvmlUnavailable(
                "NVML started but no GPU answered" if self.unanswered else "NVML started but sees no GPU"
            )
        # Sample timestamps come from NVML's clock: work in it (see clock_offset_us).
        self._clock_offset_us = clock_offset_us(backend, [g.index for g in self._inventory], self._wall_us)
        if ring_every_s is None:
            span = ring_span_s(backend, [g.index for g in self._inventory])
            ring_every_s = (
                min(RING_EVERY_MAX_S, max(interval_s, 0.6 * span)) if span else RING_EVERY_DEFAULT_S
            )
        self._ring_every_s = ring_every_s
        self._interval_us = int(interval_s * 1e6)
        self._gpus = []
        for info in self._inventory:
            try:
                gpm = backend.gpm_supported(info.index)
            except GpuLost:
                gpm = False
            self._gpus.append(_GpuState(info, gpm))

    def _nvml_now_us(self) -> int:
        return self._wall_us() - self._clock_offset_us

    def inventory(self) -> list[GpuInfo]:
        return list(self._inventory)

    @property
    def exhausted(self) -> bool:
        return False

    def sample(self, now: dt.datetime) -> Tick:
        tick = Tick()
        live_pids: set[int] = set()
        for gpu in self._gpus:
            try:
                if gpu.lost_since is not None and not self._probe_lost(gpu):
                    tick.gpu_rows.append(self._lost_row(gpu, now))
                    continue
                ready = self._sample_gpu(gpu, now)
            except GpuLost:
                # Ticks sampled before it went: kept, without the ring values that died with it.
                for row, procs, _, _ in gpu.pending:
                    tick.gpu_rows.append(row)
                    tick.process_rows.extend(procs)
                gpu.pending.clear()
                if gpu.lost_since is None:
                    gpu.lost_since = self._clock()
                    gpu.lost_probe_at = gpu.lost_since
                    if gpu.gpm_prev is not None:  # its samples died with the GPU
                        with contextlib.suppress(GpuLost):
                            self._backend.gpm_free(gpu.gpm_prev)
                        gpu.gpm_prev = None
                tick.gpu_rows.append(self._lost_row(gpu, now))
                continue
            for row, procs in ready:
                tick.gpu_rows.append(row)
                tick.process_rows.extend(procs)
                live_pids.update(p["pid"] for p in procs)
        # Processes of ticks still waiting for their ring read keep their cached names too.
        waiting = {p["pid"] for g in self._gpus for _, procs, _, _ in g.pending for p in procs}
        self._procinfo.forget_except(live_pids | waiting)
        return tick

    def drain(self) -> Tick:
        """The ticks still waiting for a ring read, resolved now (the collector is stopping)."""
        tick = Tick()
        for gpu in self._gpus:
            if not gpu.pending:
                continue
            try:
                ready = self._resolve(gpu)
            except GpuLost:
                ready = [(row, procs) for row, procs, _, _ in gpu.pending]
                gpu.pending.clear()
            for row, procs in ready:
                tick.gpu_rows.append(row)
                tick.process_rows.extend(procs)
        return tick

    def _probe_lost(self, gpu: _GpuState) -> bool:
        """Re-probe a lost GPU now and then; True once it answers again."""
        if self._clock() - gpu.lost_probe_at < self._lost_retry_s:
            return False
        gpu.lost_probe_at = self._clock()
        try:
            if self._backend.memory(gpu.info.index) is None:
                return False
        except GpuLost:
            return False
        gpu.lost_since = None
        gpu.util_since_us = gpu.mem_since_us = gpu.proc_since_us = None  # start afresh
        return True

    def _base_row(self, gpu: _GpuState, now: dt.datetime, state: str) -> dict:
        return {
            "ts": now,
            "gpu_index": gpu.info.index,
            "gpu_uuid": gpu.info.uuid,
            "gpu_name": gpu.info.name,
            "state": state,
            "mem_total_bytes": gpu.info.mem_total_bytes or None,
            "source": self.kind,
            "simulated": False,
        }

    def _lost_row(self, gpu: _GpuState, now: dt.datetime) -> dict:
        return self._base_row(gpu, now, "lost")

    def _sample_gpu(self, gpu: _GpuState, now: dt.datetime) -> list[tuple[dict, list[dict]]]:
        """Sample one GPU's cheap fields now; return the ticks whose ring values are known by now."""
        b, i = self._backend, gpu.info.index
        end_us = self._nvml_now_us()
        if gpu.util_since_us is None:  # the first tick summarises the interval before it
            gpu.util_since_us = gpu.mem_since_us = gpu.proc_since_us = end_us - self._interval_us
            gpu.tick_end_us = end_us - self._interval_us
        start_us, gpu.tick_end_us = gpu.tick_end_us, end_us
        row = self._base_row(gpu, now, "ok")
        memory = b.memory(i)
        if memory is not None:
            row["mem_used_bytes"], row["mem_total_bytes"] = memory
        row["power_w"] = b.power_w(i)
        row["temperature_c"] = b.temperature_c(i)
        row["sm_clock_hz"] = b.sm_clock_hz(i)
        mono = self._clock()
        if gpu.energy_at is None or mono - gpu.energy_at >= self._energy_every_s:
            row["energy_j"] = b.energy_j(i)
            gpu.energy_at = mono
        if gpu.gpm:
            row.update(self._gpm(gpu, mono))
        gpu.pending.append((row, self._processes(gpu, now), start_us, end_us))
        if gpu.ring_read_at is not None and mono - gpu.ring_read_at < self._ring_every_s:
            return []
        gpu.ring_read_at = mono
        return self._resolve(gpu)

    def _resolve(self, gpu: _GpuState) -> list[tuple[dict, list[dict]]]:
        """Read the rings once and give every waiting tick the samples of its own interval."""
        self._utilization(gpu)
        self._process_shares(gpu)
        ready = [(row, procs) for row, procs, _, _ in gpu.pending]
        gpu.pending.clear()
        return ready

    def _utilization(self, gpu: _GpuState) -> None:
        b, i = self._backend, gpu.info.index
        fallback = None
        for kind, attr, prefix in (
            ("gpu", "util_since_us", "util_gpu"),
            ("memory", "mem_since_us", "util_mem"),
        ):
            # Samples newer than the last waiting tick belong to the next one: leave them in the ring.
            last_end = gpu.pending[-1][3]
            samples = [
                x for x in b.utilization_samples(i, kind, getattr(gpu, attr)) or [] if x[0] <= last_end
            ]
            if samples:
                setattr(gpu, attr, max(ts for ts, _ in samples))
            for row, _, start_us, end_us in gpu.pending:
                own = [s for s in samples if start_us < s[0] <= end_us]
                if own:
                    row[f"{prefix}_mean"], row[f"{prefix}_max"] = _summary(own)
                    gpu.last_sample[kind] = own[-1][1] / 100.0
                    continue
                # No driver sample in this tick (ticks shorter than the driver's sample period, or a
                # GPU without a ring): the value in effect, else the instantaneous rate.
                value = gpu.last_sample.get(kind)
                if value is None:
                    if fallback is None:
                        fallback = b.utilization_rates(i) or (None, None)
                    raw = fallback[0] if kind == "gpu" else fallback[1]
                    value = None if raw is None else raw / 100.0
                if value is not None:
                    row[f"{prefix}_mean"] = row[f"{prefix}_max"] = value

    def _gpm(self, gpu: _GpuState, mono: float) -> dict:
        b, i = self._backend, gpu.info.index
        if gpu.gpm_prev is not None and mono - gpu.gpm_prev_at < self._gpm_min_gap_s:
            return {}  # too soon after the previous sample: NVML needs ≥ 100 ms between the two
        sample = b.gpm_sample(i)
        if sample is None:
            return {}
        out = {}
        if gpu.gpm_prev is not None:
            out = {k: v for k, v in b.gpm_metrics(gpu.gpm_prev, sample).items() if k in GPM_COLUMNS}
            b.gpm_free(gpu.gpm_prev)
        gpu.gpm_prev, gpu.gpm_prev_at = sample, mono
        return out

    def _processes(self, gpu: _GpuState, now: dt.datetime) -> list[dict]:
        """Process rows of this tick; their busy share is filled in when the ring is read."""
        i = gpu.info.index
        procs = self._backend.processes(i)
        if not procs:
            return []
        rows = []
        for pid, mem in procs:
            name, user, container = self._procinfo.describe(pid)
            rows.append(
                {
                    "ts": now,
                    "gpu_index": i,
                    "gpu_uuid": gpu.info.uuid,
                    "pid": pid,
                    "process_name": name,
                    "user": user,
                    "container_id": container,
                    "mem_used_bytes": mem,
                    "sm_util": None,
                    "source": self.kind,
                    "simulated": False,
                }
            )
        return rows

    def _process_shares(self, gpu: _GpuState) -> None:
        if not any(procs for _, procs, _, _ in gpu.pending):
            return
        util = self._backend.process_utilization(gpu.info.index, gpu.proc_since_us)
        if util is None:
            return  # not reported here (MIG, older GPUs): sm_util stays null
        last_end = gpu.pending[-1][3]
        util = [x for x in util if x[1] <= last_end]  # newer ones belong to the next tick
        for _, ts, _ in util:
            gpu.proc_since_us = max(gpu.proc_since_us, ts)
        for _, procs, start_us, end_us in gpu.pending:
            shares: dict[int, list[float]] = {}
            for pid, ts, sm in util:
                if start_us < ts <= end_us:
                    shares.setdefault(pid, []).append(sm / 100.0)
            for row in procs:
                s = shares.get(row["pid"])
                row["sm_util"] = sum(s) / len(s) if s else 0.0

    def close(self) -> None:
        for gpu in self._gpus:
            if gpu.gpm_prev is not None:
                with contextlib.suppress(GpuLost):
                    self._backend.gpm_free(gpu.gpm_prev)
                gpu.gpm_prev = None
        self._backend.stop()
