"""The one sampling loop (``collector.run``), as gpustat-collect and the pool server's sampler use it:
without a writer, each tick handed on, a failing tick told once while sampling goes on."""

from __future__ import annotations

import threading
import time

import pyarrow.dataset as ds
import pytest

import collector
from collector import RunOptions, SimulatedFleet, run
from collector._simulated_source import SimulatedSource
from server import _serve
from server._config import ServerConfig
from server._events import EventLog


class FailingTicks:
    """A simulated fleet whose ticks ``fail`` (numbers, from 1) raise the same error: a seam fake."""

    def __init__(self, fail: set[int]):
        self.inner = SimulatedSource(SimulatedFleet(2, "h"))
        self.kind, self.simulated, self.exhausted = self.inner.kind, True, False
        self.fail, self.n = fail, 0

    def inventory(self):
        return self.inner.inventory()

    def sample(self, now):
        self.n += 1
        if self.n in self.fail:
            raise RuntimeError("NVML_ERROR_UNKNOWN")
        return self.inner.sample(now)

    def drain(self):
        return self.inner.drain()

    def close(self):
        pass


def test_without_a_writer_every_tick_is_handed_on():
    """The server samples for its live view even without --telemetry: no writer, each tick's rows
    reach ``on_tick``."""
    ticks = []
    stats = run(
        SimulatedSource(SimulatedFleet(3, "h")),
        None,
        RunOptions(interval_s=0.01, duration_s=0.2),
        stop=threading.Event(),
        on_tick=ticks.append,
    )
    assert stats.ticks == len(ticks) >= 2
    assert all(sorted(r["gpu_index"] for r in t.gpu_rows) == [0, 1, 2] for t in ticks)


def test_a_failing_tick_is_told_once_and_sampling_goes_on():
    """With ``on_error`` (a service that must keep serving) the same failure on three ticks is told
    once, and the ticks after it are sampled as before; without it the failure stops the loop."""
    told, ticks = [], []
    run(
        FailingTicks({2, 3, 4}),
        None,
        RunOptions(interval_s=0.01, duration_s=0.3),
        stop=threading.Event(),
        on_tick=ticks.append,
        on_error=told.append,
    )
    assert len(told) == 1 and isinstance(told[0], RuntimeError)
    assert len(ticks) >= 3  # tick 1 and those after the failures
    with pytest.raises(RuntimeError):
        run(FailingTicks({2}), None, RunOptions(interval_s=0.01, duration_s=0.3), stop=threading.Event())


def test_the_pool_servers_sampler_writes_telemetry_and_live_numbers_through_the_collectors_loop(
    tmp_path, monkeypatch
):
    """The pool server's sampler (on a GPU host) fills /v1/gpus' live numbers and writes gpu_samples
    as gpustat-collect does: here with the simulated fleet standing in for NVML at the source seam."""
    monkeypatch.setattr(collector, "NvmlSource", lambda interval_s: SimulatedSource(SimulatedFleet(2, "h")))
    cfg = ServerConfig(telemetry_dir=tmp_path, sample_interval_s=0.02, rollup_every_s=0)
    events = EventLog(tmp_path, "h", simulated=True, flush_interval_s=60)
    live: dict = {}
    live_procs: dict = {}
    stop = threading.Event()
    thread = threading.Thread(target=_serve._sampler, args=(cfg, events, live, live_procs, stop))
    thread.start()
    deadline = time.monotonic() + 10
    while len(live) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    stop.set()
    thread.join(10)
    events.close()
    assert sorted(live) == [0, 1] and all("util_gpu_mean" in v for v in live.values())
    assert sorted(live_procs) == [0, 1]  # each GPU's newest process rows: what a lease's NVML view reads
    written = ds.dataset(tmp_path / "gpu_samples", format="parquet").to_table()
    assert written.num_rows >= 2 and set(written.column("gpu_index").to_pylist()) == {0, 1}
