"""The simulated fleet as a collector source, and the fast backfill of its history.

Every row is marked ``simulated=True`` and ``source='simulated'``: simulated data must never pass for
GPU measurements.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable

import numpy as np
import pyarrow as pa

from collector._simulated import USERS, SimulatedFleet
from collector._source import Tick
from collector._types import GpuInfo

KIND = "simulated"
ENERGY_EVERY_S = 60.0
_BOOT_EPOCH = dt.datetime(2026, 1, 1, tzinfo=dt.UTC).timestamp()  # when the simulated driver "loaded"


def _finite(value: float) -> float | None:
    return None if np.isnan(value) else float(value)


class SimulatedSource:
    kind = KIND
    simulated = True

    def __init__(self, fleet: SimulatedFleet, *, energy_start_j: list[float] | None = None):
        self.fleet = fleet
        self._energy = list(energy_start_j) if energy_start_j is not None else None
        self._last_t: float | None = None
        self._energy_minute: list[int] = [-1] * fleet.n

    def inventory(self) -> list[GpuInfo]:
        return list(self.fleet.inventory)

    @property
    def exhausted(self) -> bool:
        return False

    def sample(self, now: dt.datetime) -> Tick:
        fleet, t = self.fleet, now.timestamp()
        state = fleet.state(np.array([t]))
        cols = {k: v[:, 0] for k, v in fleet.gpu_columns(None, state).items()}
        if self._energy is None:  # no backfill before us: start from a plausible counter
            self._energy = [250.0 * (t - _BOOT_EPOCH)] * fleet.n
        dt_s = 0.0 if self._last_t is None else max(0.0, t - self._last_t)
        self._last_t = t
        tick = Tick()
        for i, info in enumerate(fleet.inventory):
            self._energy[i] += float(cols["power_w"][i]) * dt_s
            minute = int(t // ENERGY_EVERY_S)
            energy = None
            if minute != self._energy_minute[i]:  # read "rarely", as the NVML source does
                self._energy_minute[i] = minute
                energy = self._energy[i]
            tick.gpu_rows.append(
                {
                    "ts": now,
                    "gpu_index": info.index,
                    "gpu_uuid": info.uuid,
                    "gpu_name": info.name,
                    "state": "ok",
                    "util_gpu_mean": float(cols["util_gpu_mean"][i]),
                    "util_gpu_max": float(cols["util_gpu_max"][i]),
                    "util_mem_mean": float(cols["util_mem_mean"][i]),
                    "util_mem_max": float(cols["util_mem_max"][i]),
                    "mem_used_bytes": int(cols["mem_used_bytes"][i]),
                    "mem_total_bytes": int(cols["mem_total_bytes"][i]),
                    "power_w": float(cols["power_w"][i]),
                    "energy_j": energy,
                    "temperature_c": float(cols["temperature_c"][i]),
                    "sm_clock_hz": float(cols["sm_clock_hz"][i]),
                    "sm_activity": _finite(cols["sm_activity"][i]),
                    "sm_occupancy": _finite(cols["sm_occupancy"][i]),
                    "tensor_activity": _finite(cols["tensor_activity"][i]),
                    "dram_bw_util": _finite(cols["dram_bw_util"][i]),
                    "source": KIND,
                    "simulated": True,
                }
            )
        for slot in fleet.process_slots(state):
            for i in np.flatnonzero(slot["mask"][:, 0]):
                info = fleet.inventory[i]
                job_key = int(slot["job_key"][i, 0])
                tick.process_rows.append(
                    {
                        "ts": now,
                        "gpu_index": info.index,
                        "gpu_uuid": info.uuid,
                        "pid": int(slot["pid"][i, 0]),
                        "process_name": fleet.process_name(i),
                        "user": USERS[int(slot["user"][i, 0])],
                        "container_id": fleet.container_id(i, job_key),
                        "mem_used_bytes": int(slot["mem_used_bytes"][i, 0]),
                        "sm_util": float(slot["sm_util"][i, 0]),
                        "source": KIND,
                        "simulated": True,
                    }
                )
        return tick

    def drain(self) -> Tick:
        return Tick()  # every tick's rows leave with the tick

    def close(self) -> None:
        pass


def _ts_array(t: np.ndarray) -> pa.Array:
    return pa.array((t * 1e6).astype(np.int64), pa.int64()).cast(pa.timestamp("us", tz="UTC"))


def _nullable(values: np.ndarray) -> pa.Array:
    return pa.array(values, pa.float64(), mask=np.isnan(values))


def _flat(a: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    """(GPUs, times) -> one value per row, rows ordered by time, then GPU."""
    return np.ascontiguousarray(np.broadcast_to(a, shape).T).reshape(-1)


class _Picker:
    """Pick the (GPU, time) cells where a process slot is occupied."""

    def __init__(self, shape: tuple[int, int], g_idx: np.ndarray, t_idx: np.ndarray):
        self.shape, self.g_idx, self.t_idx = shape, g_idx, t_idx

    def __call__(self, a: np.ndarray) -> np.ndarray:
        return np.broadcast_to(a, self.shape)[self.g_idx, self.t_idx]


def backfill(
    fleet: SimulatedFleet,
    write_table: Callable[[str, pa.Table], int],
    start: dt.datetime,
    end: dt.datetime,
    *,
    step_s: float = 10.0,
    progress: Callable[[dt.datetime], None] | None = None,
    should_stop: Callable[[], bool] = lambda: False,
) -> list[float]:
    """Write the fleet's history from ``start`` to ``end`` (exclusive), one day per segment.

    Vectorised over a (GPUs x times) grid per day; returns each GPU's energy counter at ``end`` so the
    live source continues it without a jump.
    """
    t0, t1 = start.timestamp(), end.timestamp()
    energy = np.full(fleet.n, 250.0 * (t0 - _BOOT_EPOCH))
    index = np.arange(fleet.n)
    uuids = np.array([g.uuid for g in fleet.inventory], dtype=object)
    names = np.array([g.name for g in fleet.inventory], dtype=object)
    proc_names = np.array([fleet.process_name(i) for i in range(fleet.n)], dtype=object)
    users = np.array(USERS, dtype=object)
    # One grid t0 + k*step for the whole span, cut at UTC midnights into one segment per day.
    n_steps = int(np.ceil((t1 - t0) / step_s))
    k = 0
    while k < n_steps and not should_stop():  # each day is one atomic segment: stopping loses nothing
        day_end = (np.floor((t0 + k * step_s) / 86400.0) + 1) * 86400.0
        k_end = min(n_steps, int(np.ceil((day_end - t0) / step_s)))
        t = t0 + np.arange(k, k_end) * step_s
        k = k_end
        state = fleet.state(t)
        cols = fleet.gpu_columns(t, state)
        # energy: integrate power, publish once a minute (as the live sources do)
        cum = energy[:, None] + np.cumsum(cols["power_w"] * step_s, axis=1)
        energy = cum[:, -1].copy()
        minute_edge = (t % ENERGY_EVERY_S) < step_s
        cols["energy_j"] = np.where(minute_edge[None, :], cum, np.nan)

        shape = state["util"].shape
        n_rows = t.size * fleet.n
        gpu_table = {
            "ts": _ts_array(np.repeat(t, fleet.n)),
            "gpu_index": pa.array(np.tile(index, t.size), pa.int16()),
            "gpu_uuid": pa.array(np.tile(uuids, t.size), pa.string()),
            "gpu_name": pa.array(np.tile(names, t.size), pa.string()),
            "state": pa.array(["ok"] * n_rows, pa.string()),
            "source": pa.array([KIND] * n_rows, pa.string()),
            "simulated": pa.array(np.ones(n_rows, dtype=bool)),
        }
        for name, values in cols.items():
            if values.dtype.kind == "f":
                gpu_table[name] = _nullable(_flat(values, shape))
            else:
                gpu_table[name] = pa.array(_flat(values, shape))
        write_table("gpu_samples", pa.table(gpu_table))

        parts = []
        for slot in fleet.process_slots(state):
            g_idx, t_idx = np.nonzero(slot["mask"])
            if g_idx.size == 0:
                continue
            pick = _Picker(shape, g_idx, t_idx)
            jk = pick(slot["job_key"])
            jobs = list(zip(g_idx.tolist(), jk.tolist(), strict=True))
            containers = {job: fleet.container_id(*job) for job in set(jobs)}  # one uuid5 per job
            parts.append(
                pa.table(
                    {
                        "ts": _ts_array(t[t_idx]),
                        "gpu_index": pa.array(g_idx, pa.int16()),
                        "gpu_uuid": pa.array(uuids[g_idx], pa.string()),
                        "pid": pa.array(pick(slot["pid"]), pa.int64()),
                        "process_name": pa.array(proc_names[g_idx], pa.string()),
                        "user": pa.array(users[pick(slot["user"])], pa.string()),
                        "container_id": pa.array([containers[job] for job in jobs], pa.string()),
                        "mem_used_bytes": pa.array(pick(slot["mem_used_bytes"]), pa.int64()),
                        "sm_util": pa.array(pick(slot["sm_util"]), pa.float64()),
                        "source": pa.array([KIND] * g_idx.size, pa.string()),
                        "simulated": pa.array(np.ones(g_idx.size, dtype=bool)),
                    }
                )
            )
        if parts:
            write_table("process_samples", pa.concat_tables(parts).sort_by("ts"))
        if progress:
            progress(dt.datetime.fromtimestamp(float(t[-1]), dt.UTC))
    return [float(e) for e in energy]
