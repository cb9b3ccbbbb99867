"""Shared pieces of the remote-execution tests: the shim built from this tree, a host-executor worker,
and a way to run a client program against it."""

from __future__ import annotations

import contextlib
import functools
import os
import subprocess
import sys
from pathlib import Path

import pytest

from server.workers import WorkerDevice, start_worker
from virtualize.client.remote import compile_shim, remote_env

ROOT = Path(__file__).resolve().parents[1]
SHIM = ROOT / "virtualize" / "shim"
CLIENT = Path(__file__).with_name("remote_client.py")
MiB = 1 << 20

needs_cc = pytest.mark.needs("cc")  # tests/required_tools.py


@functools.cache
def _compiled_shim(base: Path) -> Path:
    out = base / "shim"
    compile_shim(out, extra_flags=("-g", "-Wall", "-Wextra", "-Werror"))
    return out


@pytest.fixture(scope="session")
def shim_dir(tmp_path_factory) -> Path:
    """The shim compiled from the sources in this tree, warnings as errors (once per test session)."""
    return _compiled_shim(tmp_path_factory.getbasetemp())


@pytest.fixture
def worker():
    handle = start_worker(
        "test-lease", [WorkerDevice(0, "", 64 * MiB)], bind_host="127.0.0.1", env={}, executor="host"
    )
    yield handle
    handle.stop()


def client_env(shim_dir: Path, handle=None, **extra) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
    if handle is not None:
        answer = {
            "id": "test-lease",
            "worker": handle.answer(),
        }
        env.update(remote_env(answer, cache_root=shim_dir.parent / "cache"))
    env["LD_LIBRARY_PATH"] = str(shim_dir)  # the sources under test, not an installed build
    env.update(extra)
    return env


def run_client(scenario: str, env: dict[str, str], timeout: float = 60) -> tuple[dict[str, str], str]:
    proc = subprocess.run(
        [sys.executable, str(CLIENT), scenario], env=env, capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return parse(proc.stdout), proc.stderr


@contextlib.contextmanager
def ipc_pair(producer_scenario: str, env: dict[str, str]):
    """Two processes of one lease: `producer_scenario`, which prints its IPC handles (memory, event) on its
    first line, and `ipc_event_consumer`, which opens them. Yields `tell(process, line)`: writes a line to
    the process's stdin and gives the words of the line it answers; `tell` has `.producer` and
    `.consumer`. Both are killed at the end."""
    producer = subprocess.Popen([sys.executable, str(CLIENT), producer_scenario], env=env,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # fmt: skip
    consumer = None
    try:
        handles = producer.stdout.readline().split(maxsplit=1)[1].strip()
        consumer = subprocess.Popen([sys.executable, str(CLIENT), "ipc_event_consumer"],
                                    env={**env, "IPC_HANDLES": handles}, stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, text=True)  # fmt: skip
        assert consumer.stdout.readline().split() == ["opened", "1"]

        def tell(proc, line: str) -> list[str]:
            proc.stdin.write(line + "\n")
            proc.stdin.flush()
            return proc.stdout.readline().split()

        tell.producer, tell.consumer = producer, consumer
        yield tell
    finally:
        for proc in (producer, consumer):
            if proc is not None:
                proc.kill()
                proc.wait(10)


def parse(stdout: str) -> dict[str, str]:
    return dict(line.split(" ", 1) for line in stdout.splitlines() if " " in line)


def expected_queries() -> dict[str, str]:
    """What tests/remote_client.py's `queries` scenario prints when every call works."""
    zero = [
        "func_attribute",
        "func_set_attribute",
        "occupancy",
        "occupancy_flags",
        "potential_block",
        "dynamic_smem",
        "kernel_attribute",
        "kernel_set_attribute",
        "kernel_function",
        "stream_priority",
        "stream_flags",
        "stream_ctx",
        "stream_id",
        "stream_device",
        "stream_device_value",
        "priority_range",
        "ctx_limit",
        "ctx_set_limit",
        "ctx_flags",
        "ctx_api_version",
        "ctx_id",
        "profiler_start",
        "profiler_stop",
        "primary_state",
        "pci_bus_id",
        "driver_version",
        "can_access_peer",
        "address_range",
        "pointer_attributes",
        "pool_set_threshold",
        "pool_get_reuse",
        "pool_trim",
        "event_record_flags",
        "sync",
        "module_unload",
    ]
    return {
        **dict.fromkeys(zero, "0"),
        "potential_block_callback": "801",  # a block-size callback lives in the client
        "stream_ctx_is_current": "True",
        "address_range_value": "True",
        "pointer_attributes_values": "2,0,True",  # device memory, device 0, the allocation's size
        "function_after_unload": "400",  # the module's functions went with it
    }


def profile_rows(stderr: str) -> dict[str, dict[str, int]]:
    """The shim's GPUPOOL_SHIM_PROFILE rows: call name -> calls, waited."""
    rows = {}
    for line in stderr.splitlines():
        words = line.split()
        # gpupool: NAME calls waited total-ms mean-us sent recv kept slow slow-ms others'-mean "us"
        if len(words) == 13 and words[0] == "gpupool:" and words[2].isdigit() and words[3].isdigit():
            rows[words[1]] = {"calls": int(words[2]), "waited": int(words[3])}
    return rows
