"""What a newcomer types in the first hour, through the installed commands (issue 17).

Every bad argument is refused before anything starts, in one line, with the documented exit code and
no traceback; nothing says "serving" before it serves; a typo'd path is an error, not new state;
re-running the audit's collection never duplicates data; messages count in correct English.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from pool_harness import ROOT, ServerProc, api, client_env, gpuattach

BIN = Path(sys.executable).parent
PY = sys.executable
pytestmark = pytest.mark.timeout(180)


def cli(name: str, *args: str, timeout: float = 60, **kw) -> subprocess.CompletedProcess:
    """An installed console script, as a user types it."""
    exe = BIN / name
    assert exe.exists(), f"{name} is not installed in {BIN} (pip install -e .)"
    return subprocess.run(
        [str(exe), *args], capture_output=True, text=True, timeout=timeout, cwd=kw.pop("cwd", ROOT), **kw
    )


def one_line(out: subprocess.CompletedProcess, prog: str, code: int, *words: str) -> str:
    assert out.returncode == code, (out.returncode, out.stderr)
    assert "Traceback" not in out.stderr, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith(f"{prog}: error: "), lines[0]
    for w in words:
        assert w in lines[0], lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def telemetry(tmp_path_factory):
    from test_analytics_data import generated_fleet

    return generated_fleet(tmp_path_factory.mktemp("fh"), days=1, hosts=1, gpus_per_host=2)


# --- gpupool-server --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--port", "99999"], ["--port", "99999", "0-65535"]),
        (["--port", "http"], ["not a port number"]),
        (["--default-limit", "-1"], ["-1 is out of range", "0-100000"]),
        (["--default-limit", "inf"], ["inf is out of range", "0-100000"]),
        (["--default-limit", "nan"], ["nan is out of range", "0-100000"]),
        (["--lease-ttl", "1ms"], ["lease_ttl", "out of range (1s-1d)"]),
        (["--idle-timeout", "1ms"], ["default_idle_timeout", "out of range (1s-100y, or 0 (off))"]),
        (["--simulate-gpus", "64xH100-80GB," * 16 + "1xH100-80GB"], ["more than 1024 GPUs"]),
        (["token", "frob"], ["invalid choice"]),
    ],
)
def test_server_refuses_bad_arguments_in_one_line(args, words, tmp_path):
    out = cli("gpupool-server", *args, "--state-dir", str(tmp_path / "s"), timeout=30)
    one_line(out, "gpupool-server", 2, *words)
    assert not (tmp_path / "s").exists()  # refused before anything started


def test_server_port_out_of_range_in_the_config_file(tmp_path):
    cfg = tmp_path / "server.toml"
    cfg.write_text("[server]\nport = 70000\n")
    out = cli("gpupool-server", "--config", str(cfg), "--simulate-gpus", "1xH100-80GB", timeout=30)
    one_line(out, "gpupool-server", 2, "server.port 70000 is not 0-65535")


@pytest.mark.parametrize(
    "args",
    [["token", "list"], ["token", "revoke", "tok-1"], ["token", "create", "alice"], ["client", "list"]],
)
def test_a_typo_in_the_state_dir_is_an_error_not_new_state(args, tmp_path):
    typo = tmp_path / "typo" / "state"
    out = cli("gpupool-server", *args, "--state-dir", str(typo), timeout=30)
    one_line(out, "gpupool-server", 2, f"state directory {typo} does not exist")
    assert not (tmp_path / "typo").exists()


def test_token_list_needs_a_server_state(tmp_path):
    out = cli("gpupool-server", "token", "list", "--state-dir", str(tmp_path), timeout=30)
    one_line(out, "gpupool-server", 2, "no gpupool-server state in")
    assert list(tmp_path.iterdir()) == []
    # creating a token in an existing directory is how an admin starts before the first serve
    out = cli("gpupool-server", "token", "create", "alice", "--state-dir", str(tmp_path), timeout=30)
    assert out.returncode == 0 and out.stdout.startswith("gp_"), out.stderr
    out = cli("gpupool-server", "token", "list", "--state-dir", str(tmp_path), timeout=30)
    assert out.returncode == 0 and "alice" in out.stdout


# --- gpustat-report --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--granularity", "0"], ["--granularity", "0 is out of range", "1-20"]),
        (["--granularity", "21"], ["out of range"]),
        (["--price", "-2"], ["--price", "at least 0"]),
        (["--idle-below", "150"], ["0-100"]),
        (["--pool-gpus", "0"], ["--pool-gpus"]),
        (["--pool-gpus", "1000000000"], ["--pool-gpus", "1000000000 is out of range"]),
        (["--tz", "Mars/Base"], ["unknown time zone 'Mars/Base'"]),
        (["--heatmap", "rack"], ["invalid choice"]),
    ],
)
def test_report_build_refuses_out_of_range_options(args, words, telemetry, tmp_path):
    out = cli("gpustat-report", "build", str(telemetry), "-o", str(tmp_path / "x.html"), *args)
    one_line(out, "gpustat-report", 2, *words)
    assert not (tmp_path / "x.html").exists()


def test_report_serve_refuses_a_port_out_of_range_before_saying_serving(telemetry):
    out = cli("gpustat-report", "serve", str(telemetry), "--port", "99999")
    one_line(out, "gpustat-report", 2, "--port", "99999", "1-65535")
    assert "serving" not in out.stderr


def test_report_serve_on_a_port_in_use_is_one_line(telemetry):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        out = cli("gpustat-report", "serve", str(telemetry), "--port", str(port))
    one_line(out, "gpustat-report", 2, f"cannot listen on 127.0.0.1:{port}", "pick another --port")
    assert "serving" not in out.stderr and "No runtime found" not in out.stderr


def test_report_serve_on_an_address_that_does_not_resolve_blames_the_address(telemetry):
    """An unknown --address is the address's fault: the hint names --address, not the port."""
    out = cli("gpustat-report", "serve", str(telemetry), "--address", "no-such-host.invalid")
    line = one_line(out, "gpustat-report", 2, "cannot listen on no-such-host.invalid", "--address must be")
    assert "--port" not in line and "serving" not in out.stderr


def test_server_on_a_host_that_does_not_resolve_blames_the_host(tmp_path):
    """gpupool-server --host with a name that does not resolve: the hint names --host, not --port."""
    out = cli("gpupool-server", "--host", "no-such-host.invalid", "--simulate-gpus", "1xH100-80GB",
              "--state-dir", str(tmp_path / "s"), timeout=30)  # fmt: skip
    line = [x for x in out.stderr.splitlines() if "error:" in x]
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert (
        len(line) == 1 and "cannot listen on no-such-host.invalid" in line[0] and "--host must be" in line[0]
    )
    assert "--port" not in line[0]


# --- gpustat-collect: the audit script's collection, run twice ------------------------------------------
def test_running_the_audit_collection_twice_does_not_duplicate_history(tmp_path):
    import duckdb

    out_dir = tmp_path / "telemetry"
    args = ["--out", str(out_dir), "--simulate", "2", "--duration", "1", "--interval", "1"]
    args += ["--backfill", "1d", "--backfill-step", "60s", "--host", "audit-host"]
    first = cli("gpustat-collect", *args)
    assert first.returncode == 0, first.stderr
    glob = str(out_dir / "gpu_samples" / "**" / "*.parquet")
    count = f"SELECT count(*), count(DISTINCT (gpu_uuid, ts)) FROM read_parquet('{glob}', hive_partitioning = true)"
    rows1, distinct1 = duckdb.connect().execute(count).fetchone()
    assert rows1 == distinct1 and rows1 >= 2 * 24 * 60 - 2
    second = cli("gpustat-collect", *args)
    assert second.returncode == 0, second.stderr
    assert "already holds samples of audit-host" in second.stderr
    rows2, distinct2 = duckdb.connect().execute(count).fetchone()
    assert rows2 == distinct2  # no sample twice
    assert rows2 - rows1 < 20  # only the second run's own few seconds (plus the minute between runs)


def test_audit_script_installs_quietly_and_backfills_once():
    script = (ROOT / "scripts" / "audit.sh").read_text()
    assert "quiet .venv/bin/python -m pip install" in script
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    # Every folder that ships package data is a listed package: setuptools then has nothing to warn about.
    packages = set(pyproject["tool"]["setuptools"]["packages"])
    for pkg in list(packages):
        for sub in (ROOT / pkg.replace(".", "/")).iterdir():
            if sub.is_dir() and any(sub.glob("*.c")) and not (sub / "__init__.py").exists():
                assert f"{pkg}.{sub.name}" in packages, f"{pkg}.{sub.name} ships data but is not listed"


# --- gpupool-console ------------------------------------------------------------------------------------
def test_console_help_uses_the_servers_default_port():
    out = cli("gpupool-console", "--help")
    assert out.returncode == 0 and "7070" not in out.stdout and ":56001" in out.stdout


# --- gpuattach ------------------------------------------------------------------------------------------
def test_gpuattach_unknown_command_lists_only_public_ones():
    out = gpuattach("frobnicate", env={})
    line = one_line(out, "gpuattach", 125, "invalid choice: 'frobnicate'", "'run'")
    assert "_keep" not in line


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["run", "-n", "1", "-p", "1.5", "--", "true"], ["-p", "out of range (0.015625-1)"]),
        (["run", "-n", "1", "-p", "1e-300", "--", "true"], ["-p", "out of range (0.015625-1)"]),
        (["run", "-n", "1", "-p", "abc", "--", "true"], ["-p", "not a number: 'abc'"]),
        (["run", "-n", "0", "--", "true"], ["-n", "out of range (1-1024)"]),
        (["run", "-n", "1000000", "--", "true"], ["-n", "out of range (1-1024)"]),
        (["request", "-n", "1", "-m", "-5"], ["-m", "out of range (1-1073741824 MiB)"]),
        (["request", "-n", "1", "-m", "99999999999"], ["-m", "99999999999 is out of range"]),
        (
            ["run", "-n", "1", "--timeout", "99999999999y", "--", "true"],
            ["--timeout", "out of range (0s-100y)"],
        ),
        (["run", "-n", "1", "--sm-share", "2", "--", "true"], ["--sm-share"]),
        (["run", "--", "true"], ["give -n N"]),
        (["run", "-n", "1"], ["no command to run"]),
        (["leases", "--frob"], ["unrecognized arguments: --frob"]),
    ],
)
def test_gpuattach_bad_usage_is_one_line_and_125(args, words, tmp_path):
    env = client_env(tmp_path, ["127.0.0.1:1"], "gp_x")
    one_line(gpuattach(*args, env=env), "gpuattach", 125, *words)


@pytest.mark.parametrize(
    "args",
    [
        ["leases"],
        ["list-gpus"],
        ["smi"],
        ["servers"],
        ["request", "-n", "1", "--local"],
        ["run", "-n", "1", "--", "true"],
    ],
)
def test_gpuattach_server_down_is_an_error_in_every_subcommand(args, tmp_path):
    env = client_env(tmp_path, ["127.0.0.1:1"], "gp_x")
    out = gpuattach(*args, env=env)
    assert out.returncode == 125, out.stderr
    assert "no leases" not in out.stderr and "Traceback" not in out.stderr
    if args[0] != "servers":  # servers prints its table with the server DOWN
        one_line(out, "gpuattach", 125, "127.0.0.1:1 unreachable", "hint:")


@pytest.fixture(scope="module")
def sim_server(tmp_path_factory):
    srv = ServerProc(tmp_path_factory.mktemp("fh-pool") / "s", "2xH100-80GB").start()
    yield srv
    srv.stop()


def test_gpuattach_wrong_token_is_an_error_with_a_hint(sim_server, tmp_path):
    env = client_env(tmp_path, [sim_server.url], "gp_wrong_token_1234567890")
    for cmd in (["leases"], ["list-gpus"], ["smi"]):
        out = gpuattach(*cmd, env=env)
        line = one_line(out, "gpuattach", 125, "invalid token", "hint:")
        assert line.count(sim_server.url.split("://")[1]) == 1  # the server is named once


@pytest.mark.parametrize("server", ["127.0.0.1:99999", "127.0.0.1:http", "127.0.0.1:", "http://:56001"])
def test_gpuattach_bad_port_in_server_is_named_as_one(server, tmp_path):
    """A bad --server address is named as such (not "stray characters in the token"), before any
    server is asked."""
    env = client_env(tmp_path, ["127.0.0.1:1"], "gp_x")
    for cmd in (["servers"], ["leases"], ["run", "-n", "1", "--local", "--", "true"]):
        line = one_line(
            gpuattach("--server", server, *cmd, env=env), "gpuattach", 125, "port 1-65535", "host:port"
        )
        assert "token" not in line


def test_gpuattach_servers_with_a_refused_token_is_not_up(sim_server, tmp_path):
    """`gpuattach servers` with a token the server refuses: the row says TOKEN REFUSED (not "up")
    and the command fails with the server's reason; with a good token the same server is up."""
    env = client_env(tmp_path, [sim_server.url], "gp_wrong_token_1234567890")
    out = gpuattach("servers", env=env)
    assert out.returncode == 125 and "TOKEN REFUSED" in out.stdout and " up " not in out.stdout
    assert (
        out.stderr.strip()
        .splitlines()[-1]
        .startswith("gpuattach: error: 1 server refused the token: invalid token")
    )
    out = gpuattach("servers", "--json", env=env)
    assert out.returncode == 125 and json.loads(out.stdout)[0]["token"].startswith("refused: invalid token")
    no_token = tmp_path / "no-token.toml"
    no_token.write_text(f"servers = [{json.dumps(sim_server.url)}]\n")
    out = gpuattach("servers", env={**env, "GPUPOOL_CONFIG": str(no_token)})
    assert out.returncode == 125 and "NO TOKEN" in out.stdout and " up " not in out.stdout
    assert out.stderr.strip().splitlines()[-1].startswith("gpuattach: error: no token configured")
    good = client_env(tmp_path, [sim_server.url], sim_server.token("checker"))
    out = gpuattach("servers", env=good)
    assert out.returncode == 0 and " up " in out.stdout and "REFUSED" not in out.stdout


def test_gpuattach_counts_in_english(sim_server, tmp_path):
    env = client_env(tmp_path, [sim_server.url], sim_server.token("counter"))
    out = gpuattach("servers", env=env)
    assert out.returncode == 0 and "(1 server asked at once" in out.stderr, out.stderr
    out = gpuattach("smi", env=env)
    assert "pool of 1 server (1 up), 2 GPUs" in out.stdout


def test_a_session_lease_that_cannot_serve_is_refused_when_requested(sim_server, tmp_path):
    env = client_env(tmp_path, [sim_server.url], sim_server.token("session"))
    # simulated GPUs run no remote work: the request itself is refused, not the first run on it
    out = gpuattach("request", "-n", "2", "-p", "0.5", "--no-keeper", env=env)
    one_line(out, "gpuattach", 125, "no server of the pool runs remote leases", "--local")
    # docs/pool.md: request --local, then run --lease as shown (no --local again)
    out = gpuattach("request", "-n", "1", "-p", "0.5", "--local", "--no-keeper", env=env)
    assert out.returncode == 0, out.stderr
    lease = out.stdout.strip()
    assert f"gpuattach run --lease {lease}" in out.stderr  # the next step, said once
    code = "import os, sys; print(os.environ['GPUPOOL_LEASE_ID']); sys.exit(3)"
    out = gpuattach("run", "--lease", lease, "--", PY, "-c", code, env=env)
    assert out.returncode == 3 and out.stdout.strip() == lease, out.stderr
    assert (
        api(sim_server.url, "GET", f"/v1/leases/{lease}", sim_server.token("session"))[1]["state"] == "active"
    )
    out = gpuattach("release", lease, env=env)
    assert out.returncode == 0, out.stderr


def test_plural_helper():
    from collector.words import plural

    assert [plural(1, "server"), plural(2, "server"), plural(0, "GPU"), plural(1_500, "row")] == [
        "1 server",
        "2 servers",
        "0 GPUs",
        "1,500 rows",
    ]
    assert plural(1, "process") == "1 process" and plural(3, "process") == "3 processes"
    assert plural(2.5, "GPU") == "2.5 GPUs"


# --- the report: the answer first, readable names, capped tables ----------------------------------------
@pytest.fixture(scope="module")
def audit_html(tmp_path_factory):
    """What scripts/audit.sh builds on a machine without GPUs: a simulated fleet with a backfill."""
    base = tmp_path_factory.mktemp("audit")
    out = cli(
        "gpustat-collect",
        "--out",
        str(base / "t"),
        "--simulate",
        "8",
        "--duration",
        "1",
        "--backfill",
        "2d",
        "-q",
    )
    assert out.returncode == 0, out.stderr
    out = cli("gpustat-report", "build", str(base / "t"), "-o", str(base / "audit.html"))
    assert out.returncode == 0, out.stderr
    return (base / "audit.html").read_text()


def _text(page: str) -> str:
    import re

    page = re.sub(r"<script.*?</script>", "", page, flags=re.S)
    return re.sub(r"<[^>]+>", " ", page)


def test_report_summary_is_the_answer(audit_html):
    import re

    summary = audit_html[audit_html.index("<div class='answer'>") :]
    summary = summary[: summary.index("</div>\n")]
    for label in ("How busy the GPUs really are", "Held but idle", "A pool would need", "and save"):
        assert label in summary
    assert re.search(r"\d+ of 8 GPUs", summary) and " USD" in summary
    # the answer comes before any table and before the first chart
    assert audit_html.index("A pool would need") < audit_html.index("<table")
    assert audit_html.index("A pool would need") < audit_html.index("Plotly.newPlot")


def test_report_names_are_readable_and_tables_capped(audit_html):
    import re

    shown = _text(re.sub(r"<details>.*?</details>", "", audit_html, flags=re.S))
    assert "python3 train.py" in shown and "python3 train.p " not in shown
    assert not re.search(r"\b[0-9a-f]{32,}\b", shown)  # container ids as docker ps shows them (12 hex)
    assert re.search(r"\b[0-9a-f]{12}\b", shown)
    assert "show all" in audit_html and "download attribution-container.csv" in audit_html
    assert "wait p95 / max" not in audit_html
    assert "how long those waited" in audit_html
    assert "None" not in shown and "nan" not in shown.split()
    assert "median interval 10 s" in audit_html  # the sampling as measured, not 9.99393 s
