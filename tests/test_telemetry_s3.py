"""A fleet writing to one S3-compatible bucket: real gpustat-collect processes PUT their segments over
HTTP to moto's standalone server on loopback, and analytics and gpustat-report read them back with
the same answers as from a directory holding the same objects.

Also the operator's errors (a missing bucket, refused credentials, an endpoint that does not answer)
as one line each, and an outage of the store in the middle of a run losing nothing.
"""

from __future__ import annotations

import dataclasses
import math
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from s3_server import S3Server
from tcp_proxy import TcpProxy

import analytics

COLLECT = [sys.executable, "-m", "collector.cli"]
REPORT = [sys.executable, "-m", "reports.cli"]
BUCKET = "fleet"
LOCATION = f"s3://{BUCKET}/telemetry"


def run(cmd: list[str], env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, env={**os.environ, **env}, capture_output=True, text=True, timeout=timeout)


def one_line_error(proc: subprocess.CompletedProcess, prog: str) -> str:
    assert proc.returncode == 2, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith(f"{prog}: error: ")]
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    return lines[0]


@pytest.fixture(scope="module")
def s3():
    server = S3Server().start()
    server.create_bucket(BUCKET)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def fleet(s3, tmp_path_factory):
    """Two hosts' collectors writing to the bucket at the same time (an hour of backfill each, then
    a few live seconds), and a directory holding a copy of every object they wrote. Three GPUs each, so
    one is the simulated inference server, whose process is there at every hour of every day: with two
    (training, notebooks) an hour of a weekend could have no process rows at all, and the comparison of
    process rows failed on Saturdays."""
    env = {**os.environ, **s3.env()}
    common = [
        "--simulate",
        "3",
        "--backfill",
        "1h",
        "--backfill-step",
        "30",
        "--duration",
        "3",
        "--flush",
        "1",
    ]
    procs = [
        subprocess.Popen(
            [*COLLECT, *common, "-q", "--host", host, "--seed", str(seed), "--out", LOCATION],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for seed, host in enumerate(("gpu-a", "gpu-b"), start=1)
    ]
    for proc in procs:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
    copy = tmp_path_factory.mktemp("copy") / "telemetry"
    client = s3.client()
    for key in s3.keys(BUCKET, "telemetry/"):
        target = copy / key.removeprefix("telemetry/")
        target.parent.mkdir(parents=True, exist_ok=True)
        client.download_file(BUCKET, key, str(target))
    return copy


def test_collectors_write_the_directory_layout_as_objects(s3, fleet):
    keys = s3.keys(BUCKET, "telemetry/")
    segments = [k for k in keys if k.endswith(".parquet")]
    assert segments and all(
        re.fullmatch(r"telemetry/(gpu|process)_samples/date=\d{4}-\d\d-\d\d/host=gpu-[ab]/[^/]+\.parquet", k)
        for k in segments
    ), segments
    # besides the segments, only the hosts' write probes (no temporary names, no folder markers)
    assert sorted(set(keys) - set(segments)) == [
        "telemetry/.gpupool-writers/gpu-a",
        "telemetry/.gpupool-writers/gpu-b",
    ]


def test_analytics_answers_the_same_from_the_bucket_and_a_directory(s3, fleet, monkeypatch):
    for key, value in s3.env().items():
        monkeypatch.setenv(key, value)
    from_s3 = analytics.open_telemetry(LOCATION)
    from_dir = analytics.open_telemetry(fleet)
    for table in ("gpu_samples", "process_samples"):
        query = f"SELECT * FROM {table} ORDER BY ALL"
        rows = from_s3.execute(query).fetchall()
        assert rows and rows == from_dir.execute(query).fetchall()
    extent = analytics.data_extent(from_s3)
    assert extent == analytics.data_extent(from_dir)
    assert extent.hosts == ("gpu-a", "gpu-b") and len(extent.gpus) == 6
    scope = analytics.Scope()
    assert same(analytics.fleet_summary(from_s3, scope), analytics.fleet_summary(from_dir, scope))
    assert same(
        analytics.utilization_timeline(from_s3, scope), analytics.utilization_timeline(from_dir, scope)
    )
    assert same(analytics.what_if(from_s3, scope), analytics.what_if(from_dir, scope))
    # a bucket and a directory together, as for a fleet moving from one to the other
    both = analytics.open_telemetry([LOCATION, fleet])
    assert both.execute("SELECT count(*) FROM gpu_samples").fetchone()[0] == 2 * len(
        from_dir.execute("SELECT * FROM gpu_samples").fetchall()
    )


def same(a, b) -> bool:
    """Equal answers, floats to 12 digits: DuckDB sums in parallel, so the last bit of a mean may
    differ between two runs over the same files, a bucket's or a directory's."""
    if dataclasses.is_dataclass(a) and dataclasses.is_dataclass(b):
        return type(a) is type(b) and same(dataclasses.asdict(a), dataclasses.asdict(b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-12)
    return a == b


def _comparable(page: str) -> str:
    page = re.sub(r"<p class='muted'>.*?</p>", "", page, count=1)  # names the location, the build time
    return re.sub(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", "<id>", page)  # plotly's


_NUMBER = re.compile(r"\d+\.\d+(?:e-?\d+)?")  # a figure with decimals: the charts' data and the printed ones


def _equal_as_printed(u: str, v: str) -> bool:
    """Long chart numbers equal to 1e-8; a rounded figure such as `79.647` may be one unit off in its last
    printed digit, since the last bits of a parallel sum differ from run to run and it can round either way."""
    if "e" not in u and "e" not in v and min(len(u.split(".")[1]), len(v.split(".")[1])) < 6:
        places = min(len(u.split(".")[1]), len(v.split(".")[1]))
        return abs(float(u) - float(v)) <= 1.000001 * 10.0**-places
    return math.isclose(float(u), float(v), rel_tol=1e-8)


def _same_page(a: str, b: str) -> bool:
    """The same page, text for text, its figures equal as printed (`_equal_as_printed`)."""
    a, b = _comparable(a), _comparable(b)
    if _NUMBER.split(a) != _NUMBER.split(b):
        return False
    x, y = _NUMBER.findall(a), _NUMBER.findall(b)
    return len(x) == len(y) and all(_equal_as_printed(u, v) for u, v in zip(x, y, strict=True))


@pytest.mark.slow
def test_report_build_from_the_bucket_is_the_directorys_report(s3, fleet, tmp_path):
    env = s3.env()
    out_s3, out_dir = tmp_path / "s3.html", tmp_path / "dir.html"
    proc = run([*REPORT, "build", LOCATION, "-o", str(out_s3)], env)
    assert proc.returncode == 0, proc.stderr
    proc = run([*REPORT, "build", str(fleet), "-o", str(out_dir)], env)
    assert proc.returncode == 0, proc.stderr
    page = out_s3.read_text()
    assert LOCATION in page
    assert _same_page(page, out_dir.read_text())


def test_a_missing_bucket_is_one_line(s3, tmp_path):
    proc = run([*COLLECT, "--simulate", "1", "--duration", "1", "--out", "s3://no-such-bucket/t"], s3.env())
    line = one_line_error(proc, "gpustat-collect")
    assert "bucket 'no-such-bucket' does not exist" in line and s3.url in line
    proc = run([*REPORT, "build", "s3://no-such-bucket/t", "-o", str(tmp_path / "r.html")], s3.env())
    assert "bucket 'no-such-bucket' does not exist" in one_line_error(proc, "gpustat-report")


def test_an_endpoint_that_does_not_answer_is_one_line(s3, tmp_path):
    dead = S3Server().url  # a free port nobody listens on
    env = s3.env(AWS_ENDPOINT_URL_S3=dead)
    t0 = time.monotonic()
    proc = run([*COLLECT, "--simulate", "1", "--duration", "1", "--out", LOCATION], env)
    assert "object store not reachable: " + dead in one_line_error(proc, "gpustat-collect")
    proc = run([*REPORT, "build", LOCATION, "-o", str(tmp_path / "r.html")], env)
    assert "object store not reachable: " + dead in one_line_error(proc, "gpustat-report")
    assert time.monotonic() - t0 < 60
    assert not (tmp_path / "r.html").exists()


def test_refused_credentials_are_one_line(tmp_path):
    server = S3Server(auth=True).start()  # checks every key: ours was never issued by it
    try:
        env = server.env()
        proc = run([*COLLECT, "--simulate", "1", "--duration", "1", "--out", LOCATION], env)
        line = one_line_error(proc, "gpustat-collect")
        assert "refused these credentials" in line and "s3:PutObject" in line
        proc = run([*REPORT, "build", LOCATION, "-o", str(tmp_path / "r.html")], env)
        line = one_line_error(proc, "gpustat-report")
        assert "refused these credentials" in line and "s3:GetObject" in line
    finally:
        server.stop()


@pytest.mark.slow
def test_an_outage_mid_run_loses_no_sample(s3, tmp_path, monkeypatch):
    """The network to the store breaks twice while a collector runs: it keeps sampling and says so;
    the first time the rows wait in memory until the store answers again, the second time the run
    ends first, keeps them in its spool, and the next run sends them. Every sample reaches the bucket."""
    proxy = TcpProxy("127.0.0.1", s3.port)  # the collector's way to the store, to cut and heal
    env = {**os.environ, **s3.env(AWS_ENDPOINT_URL_S3=f"http://{proxy.endpoint}")}
    spool, where = tmp_path / "spool", f"s3://{BUCKET}/outage"
    args = ["--simulate", "1", "--host", "h", "--interval", "0.2", "--flush", "0.5", "--spool", str(spool)]
    proc = subprocess.Popen([*COLLECT, *args, "--out", where], env=env, stderr=subprocess.PIPE, text=True)
    lines: queue.Queue[str] = queue.Queue()
    told: list[str] = []
    reader = threading.Thread(target=lambda: [lines.put(ln) for ln in proc.stderr], daemon=True)
    reader.start()

    def wait_for(text: str) -> None:
        deadline = time.monotonic() + 30
        while not any(text in ln for ln in told):
            told.append(lines.get(timeout=max(0.1, deadline - time.monotonic())))

    try:
        wait_for("GPU (NVIDIA")  # started: the bucket took its probe
        time.sleep(1.5)  # some segments reach the bucket
        proxy.partition()
        wait_for("rows kept in memory")
        time.sleep(1)  # samples go on while the store is away
        proxy.heal()
        wait_for("telemetry written again")
        proxy.partition()
        told.clear()
        wait_for("rows kept in memory")
        proc.terminate()
        proc.wait(timeout=60)
    finally:
        proxy.close()
        if proc.poll() is None:
            proc.kill()
    reader.join(timeout=10)  # every line the collector wrote before it exited
    while not lines.empty():
        told.append(lines.get())
    err = "".join(told)
    assert proc.returncode == 2, err
    assert "rows kept in memory and retried at every flush, sampling goes on" in err
    assert f"kept in {spool}; the next gpustat-collect --out {where} sends them" in err
    spooled = list(spool.rglob("*.parquet"))
    assert spooled

    first = _rows_told(err)
    assert first["spooled"] > 0

    again = run([*COLLECT, *args, "--duration", "0.5", "--out", where], s3.env())
    assert again.returncode == 0, again.stderr
    assert not list(spool.rglob("*.parquet")), "the next run sends what the spool kept, and empties it"
    for key, value in s3.env().items():
        monkeypatch.setenv(key, value)
    con = analytics.open_telemetry(where)
    in_bucket = sum(
        con.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in ("gpu_samples", "process_samples")
    )
    assert in_bucket == first["written"] + first["spooled"] + _rows_told(again.stderr)["written"]


def _rows_told(stderr: str) -> dict[str, int]:
    """What the collector said it did with its rows at exit."""
    written = re.search(r"stopped after \d+ ticks?; (\d+) rows? in", stderr)
    spooled = re.search(r"(\d+) rows? kept in \S+; the next", stderr)
    return {"written": int(written.group(1)), "spooled": int(spooled.group(1)) if spooled else 0}


@pytest.mark.parametrize(
    ("main", "argv", "message"),
    [
        ("collector.cli", ["compact", LOCATION], "compaction works on a telemetry directory, not a bucket"),
        ("reports.cli", ["rollup", LOCATION], "rollups are built in a telemetry directory, not in a bucket"),
        ("tui.cli", ["--telemetry", LOCATION], "the console tails telemetry directories, not buckets"),
    ],
)
def test_commands_that_need_a_directory_refuse_a_bucket_in_one_line(main, argv, message, capsys):
    import importlib

    assert importlib.import_module(main).main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0] and LOCATION in err[0]


@pytest.mark.slow
def test_the_interactive_report_reads_the_bucket(s3, fleet, monkeypatch):
    # gpustat-report serve hands the app its locations os.pathsep-separated: an s3:// one keeps its ':'
    from streamlit.testing.v1 import AppTest

    from reports.app import DIRS_ENV

    for key, value in s3.env().items():
        monkeypatch.setenv(key, value)
    metrics = []
    for location in (LOCATION, str(fleet)):
        monkeypatch.setenv(DIRS_ENV, location)
        at = AppTest.from_file(str(Path(__file__).parent.parent / "reports" / "app.py"), default_timeout=60)
        at.run()
        assert not at.exception
        assert at.caption[0].value.startswith(location)
        metrics.append({m.label: m.value for m in at.metric})
    assert metrics[0] and metrics[0] == metrics[1]


@pytest.mark.slow
def test_the_pool_server_writes_its_events_to_the_bucket(s3, tmp_path, monkeypatch):
    from pool_harness import ROOT, ServerProc, api, server_cmd

    where = f"s3://{BUCKET}/pool"
    srv = ServerProc(tmp_path / "s", "1xH100-80GB", extra=("--telemetry", where), env=s3.env()).start()
    tok = srv.token("events")
    _, lease = api(srv.url, "POST", "/v1/leases", tok, {"n": 1, "fraction": 0.5})
    api(srv.url, "DELETE", f"/v1/leases/{lease['id']}", tok)
    srv.proc.send_signal(signal.SIGTERM)  # a clean stop flushes the buffered events
    assert srv.proc.wait(timeout=20) == 0
    for key, value in s3.env().items():
        monkeypatch.setenv(key, value)
    events = analytics.open_telemetry(where).execute("SELECT event FROM pool_events ORDER BY ts").fetchall()
    assert events == [("grant",), ("release",)]
    out = subprocess.run(
        [*server_cmd(), "serve", "--state-dir", str(tmp_path / "b"), "--port", "0",
         "--simulate-gpus", "1xH100-80GB", "--telemetry", "s3://no-such-bucket/p"],
        capture_output=True, text=True, timeout=60, cwd=ROOT, env={**os.environ, **s3.env()},
    )  # fmt: skip
    assert out.returncode == 2, out.stderr
    assert "--telemetry: bucket 'no-such-bucket' does not exist" in out.stderr


def test_an_nvidia_smi_log_imports_into_the_bucket(s3, tmp_path, monkeypatch):
    from test_collector_import import SMI_UNITS

    log = tmp_path / "smi.csv"
    log.write_text(SMI_UNITS)
    where = f"s3://{BUCKET}/imported"
    proc = run(
        [*COLLECT, "import", "nvidia-smi", str(log), "--out", where, "--host", "old", "--tz", "UTC"], s3.env()
    )
    assert proc.returncode == 0, proc.stderr
    for key, value in s3.env().items():
        monkeypatch.setenv(key, value)
    con = analytics.open_telemetry(where)
    assert con.execute("SELECT count(*), min(host), min(source) FROM gpu_samples").fetchone() == (
        4,
        "old",
        "nvidia-smi",
    )
