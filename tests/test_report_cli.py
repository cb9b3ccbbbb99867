"""``gpustat-report build`` and the command's errors, run as a user runs them (a real subprocess)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from test_analytics_data import GIB, gpu_rows, process_rows, write_rows

ROOT = Path(__file__).resolve().parent.parent


def report(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "reports.cli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture(scope="module")
def sim_dir(tmp_path_factory):
    from test_analytics_data import generated_fleet

    return generated_fleet(tmp_path_factory.mktemp("sim"))


@pytest.fixture
def real_dir(tmp_path):
    rows = gpu_rows("node-1", 0, [0.5] * 30, tick_s=10, mem_used=20 * GIB, sm=[0.05] * 30)
    write_rows(tmp_path, "gpu_samples", rows)
    write_rows(
        tmp_path,
        "process_samples",
        process_rows("node-1", 0, 7, range(30), mem=20 * GIB, sm_util=0.5, tick_s=10),
    )
    return tmp_path


def _sections(page: str) -> list[str]:
    return re.findall(r"<h2[^>]*>(.*?)</h2>", page)


def test_build_writes_one_self_contained_file(tmp_path, sim_dir):
    out = tmp_path / "audit.html"
    proc = report("build", str(sim_dir), "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    page = out.read_text()
    # plotly.js inlined once, nothing fetched from the network.
    assert page.count("Plotly.newPlot") >= 8
    assert not re.search(r"<script[^>]+src=", page)
    assert not re.search(r"<link[^>]+href=", page)
    assert page.count("<script type='text/javascript'>") == 1  # the one inlined copy of plotly.js
    # Every section labels the simulated data, and the banner says so up front.
    sections = _sections(page)
    assert len(sections) == 7
    assert all("SIMULATED DATA" in s for s in sections)
    assert "100.0 % of these GPU-hours come from gpupool" in page
    assert "Memory is the binding constraint" in page  # the what-if states its assumptions
    assert f"wrote {out}" in proc.stderr


def test_real_data_is_not_labelled_simulated(tmp_path, real_dir):
    out = tmp_path / "r.html"
    proc = report("build", str(real_dir), "-o", str(out), "--price", "4", "--granularity", "4")
    assert proc.returncode == 0, proc.stderr
    page = out.read_text()
    assert "SIMULATED" not in page
    assert "1/4 partitions" in page and "4.00 USD per GPU-hour (your price)" in page


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["build", "{missing}"], "telemetry directory not found"),
        (["build", "{empty}"], "no telemetry found in"),
        (
            ["build", "{real}", "--start", "2030-01-01"],
            "no gpu_samples rows in the selection (from 2030-01-01 00:00 UTC",
        ),
        (["build", "{mixed}"], "segments of schema version [1, 2] found"),
        (["serve", "{missing}"], "telemetry directory not found"),
        (["build", "{real}", "--policy", "random"], "invalid choice: 'random'"),
    ],
    ids=["missing", "empty", "empty-range", "mixed-versions", "serve-missing", "bad-policy"],
)
def test_errors_are_one_line_without_traceback(tmp_path, real_dir, args, message):
    mixed = tmp_path / "mixed"
    write_rows(mixed, "gpu_samples", gpu_rows("a", 0, [0.1]))
    write_rows(mixed, "gpu_samples", gpu_rows("b", 0, [0.1]), version=2)
    (tmp_path / "empty").mkdir()
    paths = {"missing": tmp_path / "nope", "empty": tmp_path / "empty", "real": real_dir, "mixed": mixed}
    argv = [a.format(**paths) for a in args] + ["-o", str(tmp_path / "x.html")] * (args[0] == "build")
    proc = report(*argv, timeout=60)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert message in proc.stderr
    if "invalid choice" not in message:
        # Progress lines may come first; the error is one line, the last, with a hint.
        last = proc.stderr.strip().splitlines()[-1]
        assert last.startswith("gpustat-report: error: ") and message in last and "(hint: " in last
        assert proc.stderr.count("gpustat-report: error:") == 1
    assert not (tmp_path / "x.html").exists()


def test_help_explains_each_option():
    proc = report("build", "--help", timeout=30)
    assert proc.returncode == 0
    for option in (
        "--output",
        "--start",
        "--end",
        "--hosts",
        "--granularity",
        "--policy",
        "--price",
        "--pool-gpus",
    ):
        assert option in proc.stdout
    assert "--port" in report("serve", "--help", timeout=30).stdout


def test_installed_command_runs():
    exe = Path(sys.executable).parent / "gpustat-report"
    if not exe.exists():
        pytest.skip("gpustat-report is not installed beside this interpreter (pip install -e '.[report]')")
    proc = subprocess.run([str(exe), "--help"], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0 and "serve" in proc.stdout and "build" in proc.stdout
