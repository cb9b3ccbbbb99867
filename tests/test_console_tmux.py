"""`gpupool-console` in a real terminal: tmux, a real server and collector, keys in, screen read back.

The same run an operator does by hand (docs/console.md, "Checked in a real terminal"): the console
process draws into a tmux pane of 160x45 through its own terminal driver, keys arrive through
`tmux send-keys`, and the screen is read with `tmux capture-pane -p`. Skipped where tmux is missing.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_console_pool import Server
from test_console_prometheus import _collect_cmd

pytestmark = [
    pytest.mark.slow,
    pytest.mark.needs("tmux"),
]


class Tmux:
    """One detached tmux session on a private socket (never the user's own tmux server)."""

    def __init__(self, name: str, command: str, env: dict[str, str], size=(160, 45)):
        self.base = ["tmux", "-L", f"gpupool-test-{os.getpid()}-{name}"]
        exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
        # COLUMNS/LINES from the calling shell would override the pane size the console detects.
        wrapped = f"env -u COLUMNS -u LINES {exports} {command}; echo CONSOLE-EXITED=$?; sleep 30"
        x, y = str(size[0]), str(size[1])
        self.run("new-session", "-d", "-s", name, "-x", x, "-y", y, wrapped)
        self.name = name
        self.run("resize-window", "-t", name, "-x", x, "-y", y)  # a fresh tmux server may start at 80x24

    def run(self, *args: str) -> str:
        return subprocess.run(
            [*self.base, *args], capture_output=True, text=True, timeout=15, check=True
        ).stdout

    def keys(self, *keys: str) -> None:
        self.run("send-keys", "-t", self.name, *keys)

    def screen(self) -> str:
        return self.run("capture-pane", "-p", "-t", self.name)

    def wait_for(self, *texts: str, timeout: float = 20) -> str:
        deadline = time.monotonic() + timeout
        screen = ""
        while time.monotonic() < deadline:
            screen = self.screen()
            if all(t in screen for t in texts):
                return screen
            time.sleep(0.2)
        raise AssertionError(f"never saw {texts!r} on the screen:\n{screen}")

    def close(self) -> None:
        subprocess.run([*self.base, "kill-server"], capture_output=True, timeout=15)


@pytest.fixture
def collector_dir(tmp_path):
    out = tmp_path / "tele"
    proc = subprocess.Popen(
        _collect_cmd(
            "--simulate",
            "2",
            "--out",
            str(out),
            "--interval",
            "500ms",
            "--flush",
            "1s",
            "--host",
            "simhost",
            "-q",
        ),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 20
    while not list(out.glob("gpu_samples/**/*.parquet")) and time.monotonic() < deadline:
        time.sleep(0.1)
    yield out
    proc.terminate()
    proc.wait(timeout=10)


def _console_cmd() -> str:
    script = Path(sys.executable).parent / "gpupool-console"
    return shlex.quote(str(script)) if script.exists() else f"{shlex.quote(sys.executable)} -m tui.cli"


def test_console_in_tmux_with_a_real_server_and_collector(tmp_path, collector_dir):
    server = Server(tmp_path / "state")
    lease = server.lease("bob", 1, 0.5, label="jupyter")
    tmux = None
    try:
        command = f"{_console_cmd()} --telemetry {shlex.quote(str(collector_dir))} --server {server.url} --refresh 1s"
        tmux = Tmux("console", command, {"GPUPOOL_ADMIN_TOKEN": server.tokens["ops"]})

        # Fleet: the collector's simulated host, its GPUs with sparklines, the footer's keys, and the
        # first GPU's processes (drawn after the table: waited for too, never a screen's race).
        tmux.wait_for("simhost", "SIMULATED fleet", "Util trend", "? Help", "Processes on simhost GPU 0")

        tmux.keys("2")  # Pool: the lease of bob, the server healthy
        tmux.wait_for(lease, "jupyter", "x Release", "m Migrate", "1 server(s), 1 reachable")

        tmux.keys("x")  # release it: the dialog asks first
        tmux.wait_for(f"Release lease {lease} of client bob")
        tmux.keys("y")
        tmux.wait_for(f"released lease {lease}")
        assert server.call("GET", f"/v1/leases/{lease}", "ops")["state"] == "released"
        tmux.wait_for("no active leases")

        tmux.keys("-l", "/nobody-matches")  # typed at once: every key after / belongs to the filter
        tmux.wait_for("no row matches the filter")
        tmux.keys("Escape")
        time.sleep(0.3)  # an Escape followed at once by a key reads as Alt+key in any terminal
        tmux.keys("?")
        tmux.wait_for("gpupool console — keys", "release the selected lease")
        tmux.keys("Escape")
        time.sleep(0.3)
        tmux.keys("q")
        tmux.wait_for("CONSOLE-EXITED=0")
    finally:
        if tmux is not None:
            tmux.close()
        server.stop()
