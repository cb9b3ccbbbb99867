"""A simulated GPU fleet for machines without GPUs: plausible, deterministic, and always labelled.

Every row this module produces has ``simulated=True`` and ``source='simulated'``. Each GPU follows one
workload persona, chosen in a fixed rotation so that any fleet of a few GPUs shows all of them:

- ``training``: multi-hour jobs, ~90 % busy with short input-pipeline dips, most of the memory held;
  more jobs start during working hours and on weekdays.
- ``interactive``: notebooks in working hours, bursty (a minute busy, several idle), and memory held all
  session long; some nights the notebook is left open (idle but memory held).
- ``inference``: a model server, memory constant, load following a day/night traffic curve with bursts.
- ``idle_held``: memory held by a forgotten process, almost never busy.
- ``idle``: nothing running.

Values are pure functions of (GPU, time): noise comes from hashing the time bucket, so a backfilled
week and the live samples that follow it agree, and tests are reproducible. The model is vectorised
over a (GPUs x times) grid: one code path serves one live tick and a week of backfill.
"""

from __future__ import annotations

import datetime as dt
import uuid as uuid_mod
from dataclasses import dataclass

import numpy as np

from collector._types import GpuInfo

PERSONAS = (
    "training",
    "interactive",
    "inference",
    "idle_held",
    "training",
    "interactive",
    "idle",
    "training",
)
USERS = ("alice", "bob", "chen", "dara", "eve", "farid", "gita", "hiro", "ines", "jonas")


@dataclass(frozen=True)
class _Model:
    name: str
    mem_total_bytes: int
    tdp_w: float
    idle_w: float
    clock_busy_hz: float
    clock_idle_hz: float
    gpm: bool  # GPM metrics exist on Hopper and later
    capability: tuple[int, int]


_H100 = _Model("NVIDIA H100 80GB HBM3", 81559 * 2**20, 700.0, 72.0, 1980e6, 345e6, True, (9, 0))
_A100 = _Model("NVIDIA A100-SXM4-80GB", 81920 * 2**20, 400.0, 58.0, 1410e6, 210e6, False, (8, 0))

DRIVER_VERSION = "550.54.15 (simulated)"
CUDA_VERSION = "12.4"


def _model_for(index: int) -> _Model:
    return _A100 if index % 4 == 3 else _H100  # a mixed fleet: one GPU in four is an older A100


def gpu_uuid(host: str, index: int) -> str:
    return "GPU-" + str(uuid_mod.uuid5(uuid_mod.NAMESPACE_DNS, f"gpupool-simulated/{host}/{index}"))


def simulated_inventory(n: int, host: str = "simulated") -> list[GpuInfo]:
    """The GPUs of a simulated fleet of ``n`` GPUs (for tests and machines without GPUs)."""
    return [
        GpuInfo(
            index=i,
            uuid=gpu_uuid(host, i),
            name=_model_for(i).name,
            mem_total_bytes=_model_for(i).mem_total_bytes,
            compute_capability=_model_for(i).capability,
            driver_version=DRIVER_VERSION,
            cuda_version=CUDA_VERSION,
        )
        for i in range(n)
    ]


# -- deterministic noise ---------------------------------------------------------------------------
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_GOLD = np.uint64(0x9E3779B97F4A7C15)


def _mix(x: np.ndarray) -> np.ndarray:
    # splitmix64 finaliser: a good 64-bit hash, vectorised.
    x = x ^ (x >> np.uint64(30))
    x = x * _M1
    x = x ^ (x >> np.uint64(27))
    x = x * _M2
    return x ^ (x >> np.uint64(31))


def _u01(*keys) -> np.ndarray:
    """Uniform [0, 1) noise from integer keys (arrays broadcast), the same for the same keys."""
    with np.errstate(over="ignore"):
        h = np.uint64(0x243F6A8885A308D3)
        for k in keys:
            h = _mix(h ^ (np.asarray(k).astype(np.int64).astype(np.uint64) * _GOLD))
        return (h >> np.uint64(11)).astype(np.float64) * (1.0 / 2**53)


def _bucket(t: np.ndarray, seconds: float) -> np.ndarray:
    return np.floor(t / seconds).astype(np.int64)


# -- the fleet ---------------------------------------------------------------------------------------
class SimulatedFleet:
    """N simulated GPUs of one host; ``gpu_columns``/``process_columns`` evaluate them on a time grid."""

    def __init__(self, n: int, host: str, *, seed: int = 7):
        if n < 1:
            raise ValueError("a simulated fleet needs at least one GPU")
        self.n = n
        self.host = host
        self.seed = seed
        self.inventory = simulated_inventory(n, host)
        self.personas = [PERSONAS[i % len(PERSONAS)] for i in range(n)]
        models = [_model_for(i) for i in range(n)]
        col = lambda values: np.asarray(values)[:, None]  # noqa: E731 - shape (G, 1) for broadcasting
        self._gpu_key = col([seed * 1000 + i for i in range(n)])
        self._persona = col(self.personas)
        self._mem_total = col([m.mem_total_bytes for m in models]).astype(np.float64)
        self._tdp = col([m.tdp_w for m in models])
        self._idle_w = col([m.idle_w for m in models])
        self._clock_busy = col([m.clock_busy_hz for m in models])
        self._clock_idle = col([m.clock_idle_hz for m in models])
        self._gpm = col([m.gpm for m in models])

    def _is(self, persona: str) -> np.ndarray:
        return self._persona == persona

    def state(self, t: np.ndarray) -> dict[str, np.ndarray]:
        """Per (GPU, time) utilization and memory share plus the job slots that explain them."""
        t = np.asarray(t, dtype=np.float64)[None, :]
        g = self._gpu_key
        hour = (t % 86400.0) / 3600.0
        weekday = ((np.floor(t / 86400.0) + 3) % 7) < 5  # 1970-01-01 was a Thursday
        work = weekday & (hour >= 9) & (hour < 19)
        day = _bucket(t, 86400)

        # training: 2-hour blocks, more likely on during working hours
        block = _bucket(t, 7200)
        train_on = _u01(g, block, 1) < np.where(work, 0.85, np.where(weekday, 0.6, 0.45))
        dip = _u01(g, _bucket(t, 5), 2) < 0.08  # input pipeline stalls
        train_util = np.where(dip, 0.25, 0.86 + 0.12 * _u01(g, _bucket(t, 5), 3))
        train_mem = 0.70 + 0.25 * _u01(g, block, 4)

        # interactive: 30-minute sessions in working hours, a busy minute now and then
        session = work & (_u01(g, _bucket(t, 1800), 5) < 0.8)
        left_open = (~work) & (_u01(g, day, 6) < 0.45) & (hour >= 19)  # notebook left open tonight
        busy_minute = _u01(g, _bucket(t, 60), 7) < 0.22
        inter_util = np.where(session & busy_minute, 0.55 + 0.45 * _u01(g, _bucket(t, 3), 8), 0.0)
        inter_mem = np.where(session | left_open, 0.25 + 0.35 * _u01(g, day, 9), 0.0)

        # inference: constant memory, diurnal traffic peaking mid-afternoon, bursts
        traffic = 0.12 + 0.45 * np.clip(np.cos((hour - 14.0) / 24.0 * 2 * np.pi), 0.0, None)
        traffic = np.where(weekday, traffic, traffic * 0.55)
        burst = _u01(g, _bucket(t, 10), 10) < 0.05
        infer_util = np.clip(
            traffic * (0.6 + 0.8 * _u01(g, _bucket(t, 2), 11)) + np.where(burst, 0.4, 0), 0, 1
        )

        # idle but memory held: a poke once in a while
        poke = _u01(g, _bucket(t, 60), 12) < 0.02
        held_util = np.where(poke, 0.1 + 0.2 * _u01(g, _bucket(t, 60), 13), 0.0)

        util = np.select(
            [self._is("training"), self._is("interactive"), self._is("inference"), self._is("idle_held")],
            [np.where(train_on, train_util, 0.0), inter_util, infer_util, held_util],
            0.0,
        )
        mem_share = np.select(
            [self._is("training"), self._is("interactive"), self._is("inference"), self._is("idle_held")],
            [np.where(train_on, train_mem, 0.0), inter_mem, 0.42, 0.55],
            0.0,
        )
        mem_share = np.broadcast_to(mem_share, util.shape)
        # Job identity: which block started the job (drives pid, user, container).
        job = np.select(
            [self._is("training"), self._is("interactive"), self._is("inference"), self._is("idle_held")],
            [block, day, 0, 0],
            -1,
        )
        job = np.broadcast_to(job, util.shape)
        return {"t": np.broadcast_to(t, util.shape), "util": util, "mem_share": mem_share, "job": job}

    def gpu_columns(self, t: np.ndarray, state: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        """gpu_samples columns (except ts/identity) on the grid; arrays of shape (GPUs, times)."""
        s = state if state is not None else self.state(t)
        g, tt, util = self._gpu_key, s["t"], s["util"]
        spread = 0.15 * _u01(g, _bucket(tt, 1), 20)
        factor = np.select(
            [self._is("training"), self._is("interactive"), self._is("inference")], [0.78, 0.45, 0.3], 0.05
        )
        sm_activity = util * factor
        power = self._idle_w + (self._tdp - self._idle_w) * util * (0.55 + 0.45 * factor / 0.78)
        power = power * (0.97 + 0.06 * _u01(g, _bucket(tt, 1), 21))
        temp = (
            31.0
            + 48.0 * (power - self._idle_w) / (self._tdp - self._idle_w)
            + 2.0 * _u01(g, _bucket(tt, 30), 22)
        )
        gpm = np.broadcast_to(self._gpm, util.shape)
        nan = np.full(util.shape, np.nan)
        tensor_share = np.select([self._is("training"), self._is("inference")], [0.7, 0.35], 0.1)
        return {
            "util_gpu_mean": util,
            "util_gpu_max": np.where(util > 0, np.minimum(1.0, util + spread), 0.0),
            "util_mem_mean": util * (0.3 + 0.3 * _u01(g, _bucket(tt, 1), 23)),
            "util_mem_max": np.minimum(1.0, util * 0.75),
            "mem_used_bytes": (s["mem_share"] * self._mem_total + 4 * 2**20).astype(np.int64),
            "mem_total_bytes": np.broadcast_to(self._mem_total.astype(np.int64), util.shape),
            "power_w": power,
            "temperature_c": temp,
            "sm_clock_hz": np.where(util > 0.02, self._clock_busy, self._clock_idle),
            "sm_activity": np.where(gpm, sm_activity, nan),
            "sm_occupancy": np.where(gpm, sm_activity * 0.45, nan),
            "tensor_activity": np.where(gpm, util * tensor_share, nan),
            "dram_bw_util": np.where(gpm, util * 0.35, nan),
        }

    def process_slots(self, state: dict[str, np.ndarray]) -> list[dict[str, np.ndarray]]:
        """Up to two processes per GPU per time: each slot's mask, pid, memory and busy share."""
        g, job, util, mem = self._gpu_key, state["job"], state["util"], state["mem_share"] * self._mem_total
        held = mem > 0
        inter = np.broadcast_to(self._is("interactive"), util.shape)
        # Slot 0: the main process (the training job, the notebook kernel, the server, the forgotten one).
        # Slot 1: a second notebook user sharing an interactive GPU, holding a third of its memory.
        second = inter & held & (_u01(g, job, 30) < 0.5)
        share0 = np.where(second, 2.0 / 3.0, 1.0)
        slots = []
        for slot, (mask, share) in enumerate(((held, share0), (second, 1.0 - share0))):
            h = _u01(g, job, 31 + slot)
            slots.append(
                {
                    "mask": mask,
                    "pid": (2000 + (h * 400000).astype(np.int64)),
                    "mem_used_bytes": (mem * share).astype(np.int64),
                    "sm_util": util * share,
                    "user": (_u01(g, job, 40 + slot) * len(USERS)).astype(np.int64),
                    "job_key": (g * 1_000_003 + job * 7 + slot),
                }
            )
        return slots

    def process_name(self, gpu: int) -> str:
        return {
            "training": "python3 train.py",
            "interactive": "python3 -m ipykernel",
            "inference": "tritonserver",
            "idle_held": "python3",
        }.get(self.personas[gpu], "python3")

    def container_id(self, gpu: int, job_key: int) -> str | None:
        # Training jobs and model servers run in containers; notebooks and leftovers do not.
        if self.personas[gpu] not in ("training", "inference"):
            return None
        return (uuid_mod.uuid5(uuid_mod.NAMESPACE_OID, f"{self.host}/{job_key}").hex * 2)[:64]


def to_datetime(t: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(t, dt.UTC)
