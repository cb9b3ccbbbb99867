"""gpustat-collect as a user runs it: errors in one line, the audit command line, replay, --help."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest
from test_collector_sources import FakeNvml

import analytics
from collector import _nvml_source, cli

CLI = [sys.executable, "-m", "collector.cli"]


def nvml_starts() -> bool:
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


@pytest.mark.skipif(nvml_starts(), reason="NVML starts on this machine")
def test_no_nvml_without_simulate_is_one_line_and_nonzero(tmp_path):
    proc = subprocess.run(
        [*CLI, "--out", str(tmp_path), "--duration", "1"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode != 0
    assert proc.stderr.strip() == (
        "gpustat-collect: error: no NVIDIA driver/NVML found (libnvidia-ml.so.1 not found) "
        "(hint: use --simulate N to try gpupool without GPUs)"
    )
    assert not list(tmp_path.rglob("*.parquet"))


def test_the_audit_command_line(tmp_path):
    # scripts/audit.sh runs this line (with --duration 60); here the live part is shortened
    proc = subprocess.run(
        [*CLI, "--out", str(tmp_path / "telemetry"), "--duration", "2", "--fallback-simulate", "8", "--backfill", "7d"],
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    if not nvml_starts():
        assert "--fallback-simulate: collecting a SIMULATED fleet of 8 GPUs" in proc.stderr
        assert "SIMULATED FLEET" in proc.stderr
    con = analytics.open_telemetry(tmp_path / "telemetry")
    days, gpus, all_simulated, sources = con.execute(
        "SELECT count(DISTINCT date), count(DISTINCT gpu_uuid), bool_and(simulated), list(DISTINCT source) FROM gpu_samples"
    ).fetchone()
    assert days == 8 and gpus == 8 and all_simulated and sources == ["simulated"]
    span_h = con.execute("SELECT (epoch(max(ts)) - epoch(min(ts))) / 3600 FROM gpu_samples").fetchone()[0]
    assert 167.9 < span_h < 168.1
    assert con.execute("SELECT count(DISTINCT user) FROM process_samples").fetchone()[0] >= 4


def _run_in_process(monkeypatch, argv, fake):
    # The real CLI in this process with NVML replaced at the seam (signal handlers restored after).
    original = _nvml_source.NvmlSource
    monkeypatch.setattr(_nvml_source, "NvmlSource", lambda **kw: original(fake, **kw))
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        return cli.main(argv)
    finally:
        for s, h in saved.items():
            signal.signal(s, h)


def test_backfill_is_refused_when_real_gpus_are_there(tmp_path, monkeypatch, capsys):
    code = _run_in_process(
        monkeypatch, ["--out", str(tmp_path), "--backfill", "7d", "--duration", "1"], FakeNvml(2)
    )
    assert code != 0
    err = capsys.readouterr().err.strip()
    assert err.startswith(
        "gpustat-collect: error: --backfill writes simulated history and this host has real GPUs"
    )
    assert "\n" not in err


def test_fallback_simulate_uses_nvml_when_it_starts(tmp_path, monkeypatch, capsys):
    argv = [
        "--out",
        str(tmp_path),
        "--fallback-simulate",
        "8",
        "--backfill",
        "7d",
        "--duration",
        "0.3",
        "--interval",
        "0.1s",
    ]
    assert _run_in_process(monkeypatch, argv, FakeNvml(2)) == 0
    err = capsys.readouterr().err
    assert "--backfill applies to a simulated fleet only, skipped" in err and "SIMULATED" not in err
    con = analytics.open_telemetry(tmp_path)
    assert con.execute(
        "SELECT count(DISTINCT gpu_index), bool_or(simulated), min(source) FROM gpu_samples"
    ).fetchone() == (
        2,
        False,
        "nvml",
    )


def test_replay_cli_re_emits_a_recording(tmp_path):
    rec, out = tmp_path / "rec", tmp_path / "out"
    subprocess.run(
        [*CLI, "--simulate", "2", "--out", str(rec), "--backfill", "10m", "--duration", "0.1", "-q"],
        check=True,
        timeout=60,
    )
    proc = subprocess.run(
        [*CLI, "--replay", str(rec), "--replay-speed", "600", "--interval", "0.1s", "--duration", "20", "--out", str(out)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "REPLAY of SIMULATED telemetry" in proc.stderr
    con = analytics.open_telemetry(out)
    n, sources, simulated = con.execute(
        "SELECT count(*), list(DISTINCT source), bool_and(simulated) FROM gpu_samples"
    ).fetchone()
    recorded = analytics.open_telemetry(rec).execute("SELECT count(*) FROM gpu_samples").fetchone()[0]
    assert n == recorded and sources == ["replay"] and simulated


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--simulate", "0"], "0 is out of range: a number of GPUs is 1-4096"),
        (["--interval", "often"], "not a duration: 'often'"),
        (["--simulate", "2", "--replay", "x"], "not allowed with argument"),
        (["--simulate", "2", "--host", "a/b", "--duration", "1"], "invalid host name 'a/b'"),
        (["--replay", "/nonexistent/rec"], "replay directory not found"),
    ],
)
def test_bad_options_say_what_is_wrong(tmp_path, argv, message):
    proc = subprocess.run([*CLI, "--out", str(tmp_path), *argv], capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and message in proc.stderr and "Traceback" not in proc.stderr


def test_help_is_fast_and_imports_nothing_heavy():
    code = (
        "import sys\nfrom collector.cli import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in ('pyarrow', 'pynvml', 'numpy', 'prometheus_client', 'duckdb') if m in sys.modules))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip().splitlines()[-1] == "[]"
    assert "--fallback-simulate" in proc.stdout and "compact DIR" in proc.stdout


class LosingFake(FakeNvml):
    """GPU 1 falls off the bus after a few ticks."""

    def memory(self, i):
        if i == 1 and self.calls["memory"] > 6:
            self.lost.add(1)
        return super().memory(i)


def test_a_gpu_falling_off_the_bus_is_reported_and_the_others_continue(tmp_path, monkeypatch, capsys):
    argv = ["--out", str(tmp_path), "--duration", "1", "--interval", "0.1s", "--flush", "0.2s"]
    assert _run_in_process(monkeypatch, argv, LosingFake(3)) == 0
    err = capsys.readouterr().err
    assert "GPU 1 (GPU-fake-1) stopped answering (fell off the bus?): recorded as state=lost" in err
    con = analytics.open_telemetry(tmp_path)
    per_gpu = dict(
        con.execute(
            "SELECT gpu_index, list(DISTINCT state ORDER BY state) FROM gpu_samples GROUP BY 1"
        ).fetchall()
    )
    assert per_gpu == {0: ["ok"], 1: ["lost", "ok"], 2: ["ok"]}
    ticks = con.execute("SELECT count(DISTINCT ts) FROM gpu_samples").fetchone()[0]
    assert con.execute("SELECT count(*) FROM gpu_samples WHERE gpu_index = 2").fetchone()[0] == ticks


def test_a_terminal_gets_one_self_rewriting_status_line(tmp_path):
    import os
    import pty
    import select
    import time

    pid, fd = pty.fork()
    if pid == 0:  # the child: the CLI with a terminal as stdout/stderr
        os.execv(
            sys.executable,
            [*CLI, "--simulate", "2", "--duration", "2.5", "--flush", "1s", "--out", str(tmp_path)],
        )
    out, deadline = b"", time.monotonic() + 30
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 1.0)
        if ready:
            try:
                chunk = os.read(fd, 4096)
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            out += chunk
    os.waitpid(pid, 0)
    text = out.decode(errors="replace")
    updates = text.split("\r\x1b[K")[1:]
    assert len(updates) >= 2, text  # rewritten in place, not one line per tick
    assert "gpustat-collect [SIMULATED]: 2 GPUs · " in updates[-1]
    assert "samples written" in updates[-1] and "last flush" in updates[-1]
