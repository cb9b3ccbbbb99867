"""`gpupool-console` options: every mistake is one line on stderr and exit status 2, no traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from test_live_fixtures import write_fleet

from collector.schema import METADATA_VERSION_KEY
from tui.cli import TOKEN_ENV, UsageError, build_app, parse_options


def run_cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    script = Path(sys.executable).parent / "gpupool-console"
    cmd = [str(script)] if script.exists() else [sys.executable, "-m", "tui.cli"]
    return subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=60, env=env)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "nothing to show"),
        (["--telemetry", "/no/such/dir"], "telemetry directory not found: /no/such/dir"),
        (["--server", "ftp://x"], "not a server URL"),
        (["--server", "h:7070", "--refresh", "soon"], "not a duration: 'soon'"),
        (["--server", "h:7070", "--refresh", "0s"], "must be more than zero"),
        (["--server", "h:7070", "--bogus"], "unrecognized arguments: --bogus"),
        (["--server", "h:7070", "--admin-token-file", "/no/such/token"], "cannot read the admin token file"),
        (["--server", "https://h:7070", "--ca-cert", "/no/such/ca.pem"], "CA certificate not found"),
    ],
)
def test_bad_options_are_one_line_and_exit_2(args, message):
    proc = run_cli(*args)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("gpupool-console: ") and message in lines[0]
    assert "Traceback" not in proc.stderr


def test_help_explains_every_option_without_loading_textual():
    proc = run_cli("--help")
    assert proc.returncode == 0
    for option in (
        "--telemetry",
        "--server",
        "--prometheus",
        "--admin-token",
        "--admin-token-file",
        "--ca-cert",
        "--refresh",
        "--window",
        "--timeout",
        "--history-range",
        "--view",
        TOKEN_ENV,
    ):
        assert option in proc.stdout
    probe = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from tui.cli import build_parser; build_parser();"
            "print(sorted(m for m in ('textual', 'duckdb', 'pyarrow') if m in sys.modules))",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert probe.stdout.strip() == "[]"


def test_token_from_env_flag_or_file(tmp_path):
    assert parse_options(["--server", "h:1"], env={TOKEN_ENV: "from-env"}).admin_token == "from-env"
    assert (
        parse_options(["--server", "h:1", "--admin-token", "flag"], env={TOKEN_ENV: "env"}).admin_token
        == "flag"
    )
    token_file = tmp_path / "admin"
    token_file.write_text("from-file\n")
    opts = parse_options(["--server", "h:1", "--admin-token-file", str(token_file)], env={})
    assert opts.admin_token == "from-file"
    assert parse_options(["--server", "h:1"], env={}).admin_token is None


def test_urls_durations_and_lists_are_normalised(tmp_path):
    opts = parse_options(
        [
            "--server",
            "gpu1:7070",
            "http://gpu2:7070/",
            "--server",
            "gpu1:7070",
            "--refresh",
            "500ms",
            "--window",
            "5m",
            "--telemetry",
            str(tmp_path),
        ],
        env={},
    )
    assert opts.servers == ["http://gpu1:7070", "http://gpu2:7070"]  # duplicates dropped
    assert opts.refresh_s == 0.5 and opts.window_s == 300 and opts.telemetry == [tmp_path]


def test_telemetry_of_an_unknown_schema_version_is_refused_up_front(tmp_path):
    root = write_fleet(tmp_path / "tele")
    segment = next(root.glob("gpu_samples/**/*.parquet"))
    table = pq.read_table(segment)
    pq.write_table(table.replace_schema_metadata({METADATA_VERSION_KEY: b"99"}), segment)
    with pytest.raises(UsageError, match="schema version"):
        build_app(parse_options(["--telemetry", str(root)], env={}))
    proc = run_cli("--telemetry", str(root))
    assert proc.returncode == 2 and "99] found" in proc.stderr and "Traceback" not in proc.stderr


def test_a_ca_file_that_is_not_pem_is_one_line(tmp_path):
    bad = tmp_path / "ca.pem"
    bad.write_text("not a certificate")
    proc = run_cli("--server", "https://gpu1:56001", "--ca-cert", str(bad))
    assert proc.returncode == 2 and "cannot use the CA certificate" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
