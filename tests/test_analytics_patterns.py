"""Time patterns and attribution, against hand-computed expectations on small constructed telemetry."""

from __future__ import annotations

from datetime import timedelta

import pytest
from test_analytics_data import GIB, T0, gpu_rows, process_rows, write_rows

import analytics as A


@pytest.fixture
def week(tmp_path):
    # Monday 09:00 UTC: two GPUs of host a, 10 min at 1-minute ticks, 60 % and 20 %, SM 30 % on a0.
    # Tuesday 14:00 UTC: host b, 10 min at 90 %.
    rows = gpu_rows("a", 0, [0.6] * 10, tick_s=60, sm=[0.3] * 10)
    rows += gpu_rows("a", 1, [0.2] * 10, tick_s=60)
    rows += gpu_rows("b", 0, [0.9] * 10, tick_s=60, start=T0 + timedelta(days=1, hours=5))
    write_rows(tmp_path, "gpu_samples", rows)
    return A.open_telemetry(tmp_path)


def test_hour_of_week_fleet(week):
    [grid] = A.hour_of_week(week)
    assert grid.key == "fleet"
    assert grid.util[0][9] == pytest.approx(0.4)  # Monday 09: mean of 60 % and 20 %
    assert grid.sm[0][9] == pytest.approx(0.3)  # only a0 has GPM
    assert grid.gpu_hours[0][9] == pytest.approx(20 / 60)
    assert grid.util[1][14] == pytest.approx(0.9)  # Tuesday 14
    filled = [(d, h) for d in range(7) for h in range(24) if grid.util[d][h] is not None]
    assert filled == [(0, 9), (1, 14)]


def test_hour_of_week_per_host_and_gpu_and_time_zone(week):
    per_host = {g.key: g for g in A.hour_of_week(week, level="host")}
    assert set(per_host) == {"a", "b"}
    assert per_host["a"].util[1][14] is None and per_host["b"].util[1][14] == pytest.approx(0.9)
    per_gpu = {g.key for g in A.hour_of_week(week, level="gpu")}
    assert per_gpu == {"a / GPU 0", "a / GPU 1", "b / GPU 0"}
    # Berlin is UTC+1 in early March: Monday 09:00 UTC is 10:00 there.
    [berlin] = A.hour_of_week(week, tz="Europe/Berlin")
    assert berlin.util[0][10] == pytest.approx(0.4) and berlin.util[0][9] is None
    with pytest.raises(A.TelemetryError, match="time zone"):
        A.hour_of_week(week, tz="Mars/Olympus")


def test_timeline_buckets_and_both_metrics(week):
    t = A.utilization_timeline(week, A.Scope(hosts=("a",)), bucket_s=300)
    assert t.bucket_s == 300
    assert [p.start for p in t.points] == [T0, T0 + timedelta(minutes=5)]
    assert all(p.util_gpu_mean == pytest.approx(0.4) for p in t.points)
    assert all(p.sm_activity_mean == pytest.approx(0.3) for p in t.points)
    assert [p.gpus for p in t.points] == [2, 2]
    auto = A.utilization_timeline(week, max_points=100)
    # 29 h 9 min of span in at most 100 buckets: the smallest round bucket is 30 min.
    assert auto.bucket_s == 1800


def test_busiest_and_idlest_periods(week):
    p = A.busiest_idlest(week, bucket_s=300, n=2)
    assert p.busiest[0].start == T0 + timedelta(days=1, hours=5)
    assert p.busiest[0].util_gpu_mean == pytest.approx(0.9)
    assert p.idlest[0].util_gpu_mean == pytest.approx(0.4)
    assert p.idlest[0].end - p.idlest[0].start == timedelta(minutes=5)


@pytest.fixture
def holders(tmp_path):
    # GPU a0 (1 s ticks): alice's trainer busy at 80 % with 40 GiB for 60 s, then bob's notebook
    # holding 10 GiB at 0 % for 120 s. GPU a1: carol's inference server in a container, no busy
    # share from NVML, 20 GiB for 60 s while the GPU reads 0 % (so it counts as idle holding).
    g = gpu_rows("a", 0, [0.8] * 60 + [0.0] * 120) + gpu_rows("a", 1, [0.0] * 60)
    p = process_rows("a", 0, 11, range(60), mem=40 * GIB, sm_util=0.8, user="alice", name="torchrun")
    p += process_rows("a", 0, 12, range(60, 180), mem=10 * GIB, sm_util=0.0, user="bob", name="python3")
    p += process_rows(
        "a",
        1,
        13,
        range(60),
        mem=20 * GIB,
        sm_util=None,
        user="carol",
        name="tritonserver",
        container="ctr-1",
    )
    write_rows(tmp_path, "gpu_samples", g)
    write_rows(tmp_path, "process_samples", p)
    return A.open_telemetry(tmp_path)


def test_attribution_per_user(holders):
    a = A.attribution(holders, by="user")
    rows = {r.key: r for r in a.rows}
    assert [r.key for r in a.rows] == ["bob", "alice", "carol"]  # most GPU-hours first
    assert rows["alice"].gpu_hours == pytest.approx(60 / 3600)
    assert rows["alice"].busy_gpu_hours == pytest.approx(0.8 * 60 / 3600)
    assert rows["alice"].memory_gib_hours == pytest.approx(40 * 60 / 3600)
    assert rows["alice"].idle_holding_hours == 0
    assert rows["bob"].idle_holding_hours == pytest.approx(120 / 3600)
    assert rows["bob"].idle_holding_share == pytest.approx(1.0)
    # carol has no sm_util: her GPU's 0 % decides, so she idles while holding 20 GiB.
    assert rows["carol"].idle_holding_hours == pytest.approx(60 / 3600)
    assert rows["carol"].mem_peak_bytes == 20 * GIB
    assert not a.simulated


def test_attribution_per_process_and_container(holders):
    by_name = {r.key: r for r in A.attribution(holders, by="process").rows}
    assert set(by_name) == {"torchrun", "python3", "tritonserver"}
    by_container = {r.key: r for r in A.attribution(holders, by="container").rows}
    assert by_container["ctr-1"].gpu_hours == pytest.approx(60 / 3600)
    assert by_container["(no container)"].processes == 2
    assert by_container["(no container)"].gpu_hours == pytest.approx(180 / 3600)


def test_attribution_errors(holders, tmp_path):
    with pytest.raises(A.TelemetryError, match="unknown attribution key"):
        A.attribution(holders, by="team")
    write_rows(tmp_path / "gpu-only", "gpu_samples", gpu_rows("x", 0, [0.1]))
    with pytest.raises(A.TelemetryError, match="no process_samples rows"):
        A.attribution(A.open_telemetry(tmp_path / "gpu-only"))


def test_pool_activity_from_lease_events(tmp_path):
    def ev(event, lease, client, seconds, parts, duration=None, reason=None):
        return [
            {
                "host": "srv",
                "ts": T0 + timedelta(seconds=seconds),
                "event": event,
                "lease_id": lease,
                "client": client,
                "gpu_index": i,
                "gpu_uuid": None if lease is None else f"GPU-srv-{i}",
                "fraction": f,
                "duration_s": duration,
                "reason": reason,
                "source": "server",
            }
            for i, f in enumerate(parts)
        ]

    rows = ev("grant", "L1", "ana", 0, [0.5, 0.5]) + ev("release", "L1", "ana", 3600, [0.5, 0.5], 3600)
    rows += ev("grant", "L2", "ben", 0, [0.25]) + ev("reclaim", "L2", "ben", 7200, [0.25], 7200, "idle 600 s")
    rows += ev("deny", None, "ben", 10, [None], reason="no GPU fits")
    write_rows(tmp_path, "gpu_samples", gpu_rows("srv", 0, [0.1]))
    write_rows(tmp_path, "pool_events", rows)
    p = A.pool_activity(A.open_telemetry(tmp_path))
    assert p.events == {"grant": 2, "deny": 1, "release": 1, "expire": 0, "reclaim": 1}
    # ana: two halves for an hour = 1 GPU-hour; ben: a quarter for two hours = 0.5, reclaimed.
    assert p.gpu_hours == pytest.approx(1.5)
    assert p.reclaimed_gpu_hours == pytest.approx(0.5)
    assert [(c.client, c.leases, c.denials, c.reclaimed) for c in p.clients] == [
        ("ana", 1, 0, 0),
        ("ben", 1, 1, 1),
    ]
    assert not p.empty and not p.simulated


def test_pool_activity_is_empty_before_adoption(week):
    assert A.pool_activity(week).empty


def test_gpu_hours_per_batch_job_and_account_also_over_telemetry_written_before_jobs(tmp_path):
    """pool_usage_by_job books GPU-hours to each scheduler job and account; a segment written before
    pool_events had job columns reads as leases without a job, alone and mixed with newer segments."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from collector.schema import TABLES

    def rows(lease, client, parts, hours, job=None):
        base = {"host": "srv", "lease_id": lease, "client": client, "source": "server", **(job or {})}
        return [
            {
                **base,
                "ts": T0 + timedelta(hours=h),
                "event": e,
                "gpu_index": i,
                "fraction": f,
                "duration_s": d,
            }
            for e, h, d in (("grant", 0, None), ("release", hours, hours * 3600.0))
            for i, f in enumerate(parts)
        ]

    schema = TABLES["pool_events"].arrow_schema
    old = pa.schema([c for c in schema if not c.name.startswith("job_")], metadata=schema.metadata)
    folder = tmp_path / "pool_events" / f"date={T0.date()}" / "host=srv"
    folder.mkdir(parents=True)
    data = rows("L0", "ana", [1.0], 2)
    pq.write_table(
        pa.Table.from_pylist(
            [{**{c.name: r.get(c.name) for c in old}, "schema_version": 1} for r in data], schema=old
        ),
        folder / "old.parquet",
    )
    write_rows(tmp_path, "gpu_samples", gpu_rows("srv", 0, [0.1]))
    (before,) = A.pool_usage_by_job(A.open_telemetry(tmp_path))
    assert before.job_id is None and before.gpu_hours == pytest.approx(2.0)

    physics = {"job_scheduler": "slurm/hpc", "job_account": "physics", "job_user": "ana"}
    new = rows("L1", "slurm", [0.5, 0.5], 1, {**physics, "job_id": "7"})
    new += rows("L2", "slurm", [0.25], 4, {**physics, "job_id": "8"})
    new += rows("L3", "slurm", [1.0], 3, {"job_scheduler": "slurm/hpc", "job_id": "9", "job_account": "bio"})
    write_rows(tmp_path, "pool_events", new)
    con = A.open_telemetry(tmp_path)
    jobs = {u.job_id: u for u in A.pool_usage_by_job(con)}
    assert jobs["7"].gpu_hours == pytest.approx(1.0) and jobs["8"].gpu_hours == pytest.approx(1.0)
    assert jobs["7"].account == "physics" and jobs["7"].user == "ana" and jobs["7"].leases == 1
    assert jobs[None].gpu_hours == pytest.approx(2.0)  # the old segment's lease
    accounts = [(u.account, round(u.gpu_hours, 6)) for u in A.pool_usage_by_job(con, by="account")]
    assert accounts == [("bio", 3.0), ("physics", 2.0), (None, 2.0)]  # most GPU-hours first
    with pytest.raises(ValueError, match="by must be one of"):
        A.pool_usage_by_job(con, by="user")
