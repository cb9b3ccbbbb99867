"""The collector's sources: the NVML source over a fake NVML (the seam), the simulated fleet, replay."""

from __future__ import annotations

import datetime as dt
from collections import Counter

import numpy as np
import pytest

from collector._errors import GpuLost
from collector._nvml_source import NvmlSource
from collector._procinfo import ProcessInfo, container_id_from_cgroup
from collector._replay import ReplaySource
from collector._simulated import SimulatedFleet
from collector._simulated_source import SimulatedSource, backfill
from collector.writer import TelemetryWriter

NOW = dt.datetime(2026, 3, 4, 12, 0, tzinfo=dt.UTC)  # a Wednesday noon


class FakeNvml:
    """NVML at the seam NvmlSource samples through: values per GPU, switches for the odd cases."""

    def __init__(self, gpus: int = 3):
        self.n = gpus
        self.calls: Counter[str] = Counter()
        self.unsupported: set[str] = set()  # method names that report "not supported" (None)
        self.lost: set[int] = set()
        self.gpm_gpus: set[int] = {0}
        self.ring: dict[tuple[int, str], list[tuple[int, float]]] = {}
        self.procs: dict[int, list[tuple[int, int | None]]] = {}
        self.proc_util: dict[int, list[tuple[int, int, float]]] = {}
        self.started = self.stopped = 0
        self.gpm_live: set[int] = set()  # samples allocated and not freed
        self._next_sample = 0

    def _q(self, name: str, index: int | None, value):
        self.calls[name] += 1
        if index is not None and index in self.lost:
            raise GpuLost(f"GPU {index} is lost")
        return None if name in self.unsupported else value

    def start(self):
        self.started += 1

    def stop(self):
        self.stopped += 1

    def driver_version(self):
        return "555.42"

    def cuda_version(self):
        return "12.5"

    def device_count(self):
        return self.n

    def uuid(self, i):
        return self._q("uuid", i, f"GPU-fake-{i}")

    def name(self, i):
        return self._q("name", i, "NVIDIA H100 80GB HBM3")

    def compute_capability(self, i):
        return self._q("compute_capability", i, (9, 0))

    def memory(self, i):
        return self._q("memory", i, ((i + 1) * 2**30, 80 * 2**30))

    def power_w(self, i):
        return self._q("power_w", i, 100.0 + i)

    def temperature_c(self, i):
        return self._q("temperature_c", i, 40.0)

    def sm_clock_hz(self, i):
        return self._q("sm_clock_hz", i, 1.98e9)

    def utilization_samples(self, i, kind, since_us):
        samples = [s for s in self.ring.get((i, kind), []) if s[0] > since_us]
        return self._q("utilization_samples", i, samples)

    def utilization_rates(self, i):
        return self._q("utilization_rates", i, (7.0, 3.0))

    def energy_j(self, i):
        return self._q("energy_j", i, 12345.0)

    def processes(self, i):
        return self._q("processes", i, self.procs.get(i, []))

    def process_utilization(self, i, since_us):
        return self._q("process_utilization", i, [s for s in self.proc_util.get(i, []) if s[1] > since_us])

    def gpm_supported(self, i):
        return self._q("gpm_supported", i, i in self.gpm_gpus) or False

    def gpm_sample(self, i):
        self._next_sample += 1
        self.gpm_live.add(self._next_sample)
        return self._q("gpm_sample", i, self._next_sample)

    def gpm_free(self, sample):
        self.gpm_live.discard(sample)

    def gpm_metrics(self, older, newer):
        self.calls["gpm_metrics"] += 1
        return {"sm_activity": 0.0076, "sm_occupancy": 0.01, "tensor_activity": 0.0, "dram_bw_util": None}


class Clock:
    def __init__(self):
        self.mono = 1000.0
        self.wall_us = 1_700_000_000_000_000

    def advance(self, seconds: float):
        self.mono += seconds
        self.wall_us += int(seconds * 1e6)


def make_source(fake: FakeNvml, clock: Clock, tmp_path, **kw) -> NvmlSource:
    # Most tests look at one tick at a time: read the rings every tick unless a test says otherwise.
    kw.setdefault("ring_every_s", 0.0)
    return NvmlSource(
        fake, clock=lambda: clock.mono, wall_us=lambda: clock.wall_us, procinfo=ProcessInfo(tmp_path), **kw
    )


# -- NVML source over the fake ----------------------------------------------------------------------
def test_utilization_summarises_the_driver_samples_since_the_last_tick(tmp_path):
    fake, clock = FakeNvml(1), Clock()
    src = make_source(fake, clock, tmp_path)
    t = clock.wall_us
    # five 200 ms driver samples in the first second: a kernel ran in two of them
    fake.ring[(0, "gpu")] = [(t + k * 200_000, v) for k, v in enumerate([0, 100, 100, 0, 0], start=1)]
    fake.ring[(0, "memory")] = [(t + k * 200_000, v) for k, v in enumerate([10, 30, 20, 0, 0], start=1)]
    clock.advance(1.0)
    row = src.sample(NOW).gpu_rows[0]
    assert row["util_gpu_mean"] == pytest.approx(0.4)
    assert row["util_gpu_max"] == pytest.approx(1.0)
    assert row["util_mem_mean"] == pytest.approx(0.12)
    assert row["util_mem_max"] == pytest.approx(0.3)
    # the next tick sees only newer samples, not the same ones again
    fake.ring[(0, "gpu")].append((t + 1_200_000, 50))
    clock.advance(1.0)
    row = src.sample(NOW).gpu_rows[0]
    assert (row["util_gpu_mean"], row["util_gpu_max"]) == (pytest.approx(0.5), pytest.approx(0.5))


def test_rings_are_read_once_per_batch_and_each_tick_keeps_its_own_samples(tmp_path):
    # A ring read costs ~2 ms of CPU on a real GPU: read every 5 s, sort samples into their ticks.
    fake, clock = FakeNvml(1), Clock()
    src = make_source(fake, clock, tmp_path, ring_every_s=5.0)
    t = clock.wall_us
    busy = [0, 25, 50, 75, 100, 100]  # tick k's five 200 ms samples all read busy[k] %
    fake.ring[(0, "gpu")] = [
        (t + k * 1_000_000 + j * 200_000, busy[k]) for k in range(6) for j in range(1, 6)
    ]
    fake.procs[0] = [(777, 2**30)]
    fake.proc_util[0] = [(777, t + k * 1_000_000 + 500_000, float(busy[k])) for k in range(6)]
    rows, procs = [], []
    reads_at_start = fake.calls["utilization_samples"]  # the clock-offset probe at start reads it too
    for _ in range(6):
        clock.advance(1.0)
        tick = src.sample(NOW)
        rows += tick.gpu_rows
        procs += tick.process_rows
    # tick 0 read the rings (first read), ticks 1-4 waited, tick 5 read them again: 2 reads, not 6
    assert fake.calls["utilization_samples"] - reads_at_start == 2 * 2  # gpu and memory rings
    assert fake.calls["process_utilization"] == 2
    assert [round(r["util_gpu_mean"], 2) for r in rows] == [0.0, 0.25, 0.5, 0.75, 1.0, 1.0]
    assert [round(p["sm_util"], 2) for p in procs] == [0.0, 0.25, 0.5, 0.75, 1.0, 1.0]


def test_rings_are_read_often_enough_for_their_depth(tmp_path):
    fake, clock = FakeNvml(1), Clock()
    t = clock.wall_us
    fake.ring[(0, "gpu")] = [(t - 14_000_000 + k * 200_000, 0.0) for k in range(71)]  # an H200: 14 s held
    assert make_source(fake, clock, tmp_path, ring_every_s=None)._ring_every_s == pytest.approx(8.4)
    fake.ring[(0, "gpu")] = [(t - 60_000_000 + k * 200_000, 0.0) for k in range(301)]  # a deep ring
    assert make_source(fake, clock, tmp_path, ring_every_s=None)._ring_every_s == 10.0  # rows wait ≤ 10 s
    fake.ring[(0, "gpu")] = []
    assert make_source(fake, clock, tmp_path, ring_every_s=None)._ring_every_s == 5.0  # depth unknown


def test_rows_waiting_for_the_ring_are_drained_when_the_collector_stops(tmp_path):
    fake, clock = FakeNvml(1), Clock()
    src = make_source(fake, clock, tmp_path, ring_every_s=5.0)
    t = clock.wall_us
    fake.ring[(0, "gpu")] = [(t + k * 200_000, 40.0) for k in range(1, 16)]
    emitted = []
    for _ in range(3):
        clock.advance(1.0)
        emitted += src.sample(NOW).gpu_rows
    assert len(emitted) == 1  # the first tick; two wait for the next ring read
    last = src.drain().gpu_rows
    assert len(last) == 2 and all(r["util_gpu_mean"] == pytest.approx(0.4) for r in last)
    assert src.drain().gpu_rows == []


def test_ticks_waiting_when_a_gpu_is_lost_are_kept(tmp_path):
    fake, clock = FakeNvml(2), Clock()
    src = make_source(fake, clock, tmp_path, ring_every_s=5.0)
    for _ in range(2):
        clock.advance(1.0)
        src.sample(NOW)
    fake.lost.add(1)
    clock.advance(1.0)
    rows = src.sample(NOW).gpu_rows
    gpu1 = [r for r in rows if r["gpu_index"] == 1]
    # the tick that waited (memory known, ring values gone with the GPU) and the lost tick itself
    assert [r["state"] for r in gpu1] == ["ok", "lost"]
    assert gpu1[0]["mem_used_bytes"] == 2 * 2**30


def test_no_new_ring_sample_falls_back_to_the_instant_rate(tmp_path):
    fake, clock = FakeNvml(1), Clock()
    row = make_source(fake, clock, tmp_path).sample(NOW).gpu_rows[0]
    assert row["util_gpu_mean"] == pytest.approx(0.07)
    assert row["util_mem_mean"] == pytest.approx(0.03)


def test_unsupported_fields_are_null_and_the_rest_still_reported(tmp_path):
    fake, clock = FakeNvml(2), Clock()
    fake.unsupported = {
        "power_w",
        "temperature_c",
        "utilization_samples",
        "utilization_rates",
        "process_utilization",
    }
    fake.procs[1] = [(4242, 512 * 2**20)]
    tick = make_source(fake, clock, tmp_path).sample(NOW)
    for row in tick.gpu_rows:
        assert row["power_w"] is None and row["temperature_c"] is None
        assert row.get("util_gpu_mean") is None
        assert row["mem_used_bytes"] > 0 and row["sm_clock_hz"] == 1.98e9 and row["state"] == "ok"
    (proc,) = tick.process_rows
    assert proc["pid"] == 4242 and proc["mem_used_bytes"] == 512 * 2**20
    assert proc["sm_util"] is None  # unsupported (e.g. MIG), not 0


def test_a_lost_gpu_is_recorded_and_the_others_keep_being_sampled(tmp_path):
    fake, clock = FakeNvml(3), Clock()
    src = make_source(fake, clock, tmp_path, lost_retry_s=30.0)
    assert [r["state"] for r in src.sample(NOW).gpu_rows] == ["ok"] * 3
    fake.lost.add(1)
    for _ in range(3):
        clock.advance(1.0)
        rows = src.sample(NOW).gpu_rows
        assert [r["state"] for r in rows] == ["ok", "lost", "ok"]
        assert rows[1]["gpu_uuid"] == "GPU-fake-1" and rows[1].get("power_w") is None
        assert rows[0]["power_w"] == 100.0 and rows[2]["power_w"] == 102.0
    # while lost, it is not hammered with queries; after the retry period it is probed and comes back
    memory_calls = fake.calls["memory"]
    clock.advance(1.0)
    src.sample(NOW)
    assert fake.calls["memory"] == memory_calls + 2  # GPUs 0 and 2 only
    fake.lost.clear()
    clock.advance(31.0)
    assert [r["state"] for r in src.sample(NOW).gpu_rows] == ["ok"] * 3


def test_energy_is_read_rarely(tmp_path):
    fake, clock = FakeNvml(1), Clock()
    src = make_source(fake, clock, tmp_path, energy_every_s=60.0)
    energies = []
    for _ in range(130):
        energies.append(src.sample(NOW).gpu_rows[0].get("energy_j"))
        clock.advance(1.0)
    assert fake.calls["energy_j"] == 3  # t = 0, 60, 120
    assert [i for i, e in enumerate(energies) if e is not None] == [0, 60, 120]


def test_gpm_metrics_need_two_samples_at_least_100ms_apart(tmp_path):
    fake, clock = FakeNvml(2), Clock()  # GPU 0 has GPM, GPU 1 does not (pre-Hopper)
    src = make_source(fake, clock, tmp_path)
    rows = src.sample(NOW).gpu_rows
    assert rows[0].get("sm_activity") is None  # one sample is not a measurement yet
    clock.advance(0.05)
    rows = src.sample(NOW).gpu_rows
    assert fake.calls["gpm_metrics"] == 0  # 50 ms after the first: too soon
    clock.advance(1.0)
    rows = src.sample(NOW).gpu_rows
    assert rows[0]["sm_activity"] == pytest.approx(0.0076)
    assert rows[0]["dram_bw_util"] is None
    assert rows[1].get("sm_activity") is None
    src.close()
    assert fake.gpm_live == set(), "GPM samples leaked"
    assert fake.stopped == 1


def test_process_rows_carry_busy_share_user_and_container(tmp_path):
    fake, clock = FakeNvml(1), Clock()
    cid = "a" * 64
    (tmp_path / "777").mkdir()
    (tmp_path / "777" / "comm").write_text("python3\n")
    (tmp_path / "777" / "status").write_text("Name:\tpython3\nUid:\t0\t0\t0\t0\n")
    (tmp_path / "777" / "cgroup").write_text(f"0::/system.slice/docker-{cid}.scope\n")
    fake.procs[0] = [(777, 3 * 2**30), (888, 2**30)]
    src = make_source(fake, clock, tmp_path)
    fake.proc_util[0] = [(777, clock.wall_us + 100, 60.0), (777, clock.wall_us + 200, 80.0)]
    clock.advance(1.0)
    rows = {r["pid"]: r for r in src.sample(NOW).process_rows}
    assert rows[777]["sm_util"] == pytest.approx(0.7)
    assert rows[777]["user"] == "root" and rows[777]["container_id"] == cid
    assert rows[777]["process_name"] == "python3"  # no cmdline visible: /proc's comm
    assert rows[888]["sm_util"] == 0.0  # supported, but no kernel of it ran
    assert rows[888]["user"] is None  # not visible in /proc (another PID namespace)


@pytest.mark.parametrize(
    "line",
    [
        "0::/kubepods/burstable/pod1234/cri-containerd-{cid}.scope",
        "12:memory:/docker/{cid}",
        "0::/machine.slice/libpod-{cid}.scope/container",
        "0::/system.slice/crio-{cid}.scope",
    ],
)
def test_container_ids_from_cgroup_paths_of_common_runtimes(line):
    cid = "0123456789abcdef" * 4
    assert container_id_from_cgroup(line.format(cid=cid)) == cid


def test_no_container_for_plain_processes():
    assert container_id_from_cgroup("0::/user.slice/user-1000.slice/session-3.scope\n") is None


# -- simulated fleet ----------------------------------------------------------------------------------
def _week(fleet: SimulatedFleet, step: float = 60.0):
    start = dt.datetime(2026, 3, 2, tzinfo=dt.UTC).timestamp()  # a Monday
    t = np.arange(start, start + 7 * 86400, step)
    state = fleet.state(t)
    return t, state, fleet.gpu_columns(t, state)


def test_simulated_personas_have_the_patterns_they_claim():
    fleet = SimulatedFleet(8, "sim")
    t, _state, cols = _week(fleet)
    hour = (t % 86400) / 3600
    weekday = ((np.floor(t / 86400) + 3) % 7) < 5
    work = weekday & (hour >= 9) & (hour < 19)
    util, mem = cols["util_gpu_mean"], cols["mem_used_bytes"] / cols["mem_total_bytes"]
    by = {p: [i for i, q in enumerate(fleet.personas) if q == p] for p in set(fleet.personas)}
    # training: busy most of the time when a job runs
    tr = by["training"][0]
    assert 0.35 < util[tr].mean() < 0.85 and np.median(util[tr][util[tr] > 0]) > 0.8
    # interactive: day/night — busy only in working hours, bursty (mostly idle minutes even then)
    it = by["interactive"][0]
    assert util[it][~work].max() == 0.0 and util[it][work].mean() > 0.05
    assert (util[it][work] == 0).mean() > 0.5
    assert (mem[it][~work & (hour >= 19)] > 0).any()  # some nights the notebook is left open, memory held
    # training: more jobs run in working hours than outside them, across the training GPUs
    running = util[by["training"]] > 0
    assert running[:, work].mean() > running[:, ~work].mean() + 0.1
    # idle but memory held: memory always held, almost never busy
    ih = by["idle_held"][0]
    assert mem[ih].min() > 0.5 and util[ih].mean() < 0.02
    # inference: more load in the afternoon than at night
    inf = by["inference"][0]
    afternoon, night = weekday & (hour >= 13) & (hour < 16), weekday & (hour >= 1) & (hour < 4)
    assert util[inf][afternoon].mean() > 2 * util[inf][night].mean()
    # the idle GPU: nothing at all
    assert util[by["idle"][0]].max() == 0.0
    # GPM only where the model has it (the A100s report null)
    a100 = [i for i, g in enumerate(fleet.inventory) if "A100" in g.name]
    assert a100 and np.isnan(cols["sm_activity"][a100]).all()
    assert not np.isnan(cols["sm_activity"][0]).any()
    # SM activity never exceeds the duty cycle (a busy duty cycle is not a busy GPU)
    assert (cols["sm_activity"][0] <= util[0] + 1e-9).all()


def test_simulated_fleet_is_deterministic_and_live_ticks_match_the_backfill(tmp_path):
    fleet = SimulatedFleet(4, "sim")
    end = NOW
    writer = TelemetryWriter(tmp_path, "sim", flush_interval_s=0)
    backfill(fleet, writer.write_table, end - dt.timedelta(minutes=10), end, step_s=10.0)
    import analytics

    con = analytics.open_telemetry(tmp_path)
    last = dict(
        con.execute(
            "SELECT gpu_index, util_gpu_mean FROM gpu_samples WHERE ts = (SELECT max(ts) FROM gpu_samples)"
        ).fetchall()
    )
    last_us = con.execute("SELECT epoch_us(max(ts)) FROM gpu_samples").fetchone()[0]
    last_ts = dt.datetime.fromtimestamp(last_us / 1e6, dt.UTC)
    tick = SimulatedSource(SimulatedFleet(4, "sim")).sample(last_ts)
    for row in tick.gpu_rows:
        assert row["util_gpu_mean"] == pytest.approx(last[row["gpu_index"]], abs=1e-6)
        assert row["simulated"] is True and row["source"] == "simulated"
    assert all(p["simulated"] and p["source"] == "simulated" for p in tick.process_rows)


def test_simulated_process_rows_explain_the_gpu_memory():
    fleet = SimulatedFleet(8, "sim")
    src = SimulatedSource(fleet)
    for hour in range(0, 24, 3):
        tick = src.sample(NOW.replace(hour=hour))
        held = {r["gpu_index"]: r["mem_used_bytes"] for r in tick.gpu_rows}
        per_gpu: dict[int, int] = {}
        for p in tick.process_rows:
            per_gpu[p["gpu_index"]] = per_gpu.get(p["gpu_index"], 0) + p["mem_used_bytes"]
            assert p["user"] and p["pid"] > 0
        for gpu, used in per_gpu.items():
            assert used <= held[gpu] and used > 0.9 * held[gpu] - 8 * 2**20
    containers = {p["container_id"] for p in src.sample(NOW).process_rows}
    assert None in containers and any(c and len(c) == 64 for c in containers)


def test_simulated_energy_counter_only_grows_from_backfill_into_live(tmp_path):
    fleet = SimulatedFleet(2, "sim")
    writer = TelemetryWriter(tmp_path, "sim", flush_interval_s=0)
    energy = backfill(fleet, writer.write_table, NOW - dt.timedelta(hours=2), NOW, step_s=10.0)
    src = SimulatedSource(fleet, energy_start_j=energy)
    first = src.sample(NOW).gpu_rows
    later = src.sample(NOW + dt.timedelta(seconds=61)).gpu_rows
    for i in range(2):
        assert energy[i] <= first[i]["energy_j"] < later[i]["energy_j"]


# -- replay -------------------------------------------------------------------------------------------
def test_replay_re_emits_recorded_rows_at_their_pace(tmp_path):
    rec = tmp_path / "rec"
    fleet = SimulatedFleet(2, "sim")
    writer = TelemetryWriter(rec, "sim", flush_interval_s=0)
    backfill(fleet, writer.write_table, NOW - dt.timedelta(seconds=30), NOW, step_s=10.0)
    src = ReplaySource(rec)
    assert [g.uuid for g in src.inventory()] == [g.uuid for g in fleet.inventory]
    start = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
    first = src.sample(start)
    assert len(first.gpu_rows) == 2  # the first recorded instant only
    assert all(r["source"] == "replay" and r["ts"] == start and r["simulated"] for r in first.gpu_rows)
    assert src.sample(start + dt.timedelta(seconds=5)).gpu_rows == []
    assert len(src.sample(start + dt.timedelta(seconds=10)).gpu_rows) == 2
    assert not src.exhausted
    rest = src.sample(start + dt.timedelta(hours=1))
    assert len(rest.gpu_rows) == 2 and rest.gpu_rows[0]["ts"] == start + dt.timedelta(seconds=20)
    assert src.exhausted


def test_replay_refuses_what_it_cannot_replay(tmp_path):
    from collector._errors import InputError

    with pytest.raises(InputError, match="not found"):
        ReplaySource(tmp_path / "nope")
    with pytest.raises(InputError, match="no gpu_samples"):
        ReplaySource(tmp_path)


def test_a_gpu_lost_before_start_is_reported_not_sampled(tmp_path):
    fake, clock = FakeNvml(3), Clock()
    fake.lost.add(2)
    src = make_source(fake, clock, tmp_path)
    assert src.unanswered == [2]
    assert [r["gpu_index"] for r in src.sample(NOW).gpu_rows] == [0, 1]


def test_nvml_with_no_answering_gpu_is_unavailable(tmp_path):
    from collector._errors import NvmlUnavailable

    fake, clock = FakeNvml(1), Clock()
    fake.lost.add(0)
    with pytest.raises(NvmlUnavailable, match="no GPU answered"):
        make_source(fake, clock, tmp_path)
    assert fake.stopped == 1


def test_replay_picks_one_host_of_several_and_keeps_host_names_as_text(tmp_path):
    from collector._errors import InputError

    rec = tmp_path / "rec"
    for host in ("007", "node-b"):
        w = TelemetryWriter(rec, host, flush_interval_s=0)
        backfill(SimulatedFleet(1, host), w.write_table, NOW - dt.timedelta(seconds=20), NOW, step_s=10.0)
    with pytest.raises(InputError, match=r"several hosts \(007, node-b\)"):
        ReplaySource(rec)
    src = ReplaySource(rec, host="007")
    assert [g.uuid for g in src.inventory()] == [SimulatedFleet(1, "007").inventory[0].uuid]


def test_driver_samples_on_a_clock_other_than_the_wall_clock_are_still_summarised(tmp_path):
    fake, clock = FakeNvml(1), Clock()
    boot = 5_000_000_000  # NVML stamping samples with µs since boot, say: nowhere near the epoch
    # the ring already holds 3 s of history when the collector starts: busy long ago, idle lately
    fake.ring[(0, "gpu")] = [(boot - k * 200_000, 100.0 if k > 5 else 0.0) for k in range(15, -1, -1)]
    src = make_source(fake, clock, tmp_path)
    clock.advance(1.0)
    fake.ring[(0, "gpu")] += [(boot + k * 200_000, 50.0) for k in range(1, 6)]
    row = src.sample(NOW).gpu_rows[0]
    # only the samples of the last interval, the five new ones: not the busy history before the start
    assert row["util_gpu_mean"] == pytest.approx(0.5) and row["util_gpu_max"] == pytest.approx(0.5)


def test_process_activity_counts_only_the_recent_window():
    from collector._inventory import activity_from
    from collector._source import now_us

    fake = FakeNvml(1)
    t = now_us()
    fake.ring[(0, "gpu")] = [(t - 100_000, 0.0)]
    fake.procs[0] = [(777, 2**30), (888, 2**29)]
    fake.proc_util[0] = [(777, t - 1_000_000, 40.0), (777, t - 30_000_000, 100.0)]  # busy long ago, light now
    got = {p.pid: p for p in activity_from(fake, 0, window_s=5.0)}
    assert got[777].sm_util == pytest.approx(0.4) and got[777].mem_used_bytes == 2**30
    assert got[888].sm_util == 0.0  # idle: an idle-reclaim candidate
    fake.unsupported.add("process_utilization")
    assert {p.sm_util for p in activity_from(fake, 0, window_s=5.0)} == {None}  # unknown, not idle


@pytest.mark.parametrize(
    ("cmdline", "comm", "name"),
    [
        ("/usr/bin/python3\0/home/ana/train.py\0--epochs\0005\0", "python3\n", "python3 train.py"),
        ("python3\0-u\0-m\0vllm.entrypoints.api\0", "python3", "python3 -m vllm.entrypoints.api"),
        ("/opt/tritonserver/bin/tritonserver\0--model-repo=/m\0", "tritonserver", "tritonserver"),
        ("", "python3 train.p\n", "python3 train.p"),  # kernel thread / no cmdline: comm
        (None, None, None),
    ],
)
def test_process_names_are_readable(cmdline, comm, name):
    from collector._procinfo import command_name

    assert command_name(cmdline, comm) == name
