"""Live migration of a running remote lease to another GPU of its server (virtualize.server._migrate), on the
host executor: its "GPUs" are host memory, so CI runs the whole path — a real worker process, a real
client program through the shim, the server's request through the worker's state directory."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import remote_helpers
from remote_helpers import CLIENT, MiB, client_env, needs_cc, parse

from server.workers import WorkerDevice, start_worker

pytestmark = needs_cc
shim_dir = remote_helpers.shim_dir  # a fixture


def _worker(**env):
    return start_worker("test-lease", [WorkerDevice(0, "", 64 * MiB)], bind_host="127.0.0.1",
                        env=env, executor="host")  # fmt: skip


class Client:
    """A scenario of tests/remote_client.py (`migrate` unless named), driven step by step over its stdin."""

    def __init__(self, shim: Path, handle, scenario: str = "migrate") -> None:
        self.proc = subprocess.Popen([sys.executable, str(CLIENT), scenario], env=client_env(shim, handle),
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True)  # fmt: skip
        self.seen = self.until("ready")

    def until(self, name: str) -> dict[str, str]:
        seen = {}
        for line in self.proc.stdout:
            key, _, value = line.strip().partition(" ")
            seen[key] = value
            assert key != "FAILED", value
            if key == name:
                return seen
        raise AssertionError(f"the client ended before {name!r}: {self.proc.stderr.read()}")

    def send(self, line: str) -> None:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def finish(self) -> dict[str, str]:
        self.send("done")
        out, err = self.proc.communicate(timeout=60)
        assert self.proc.returncode == 0, out + err
        return {**self.seen, **parse(out)}


def _assert_intact(result: dict[str, str]) -> None:
    """Every region at its address with its bytes, and the handles made before still work."""
    addresses = dict(pair.split("=") for pair in result["addresses"].split())
    for name, address in addresses.items():
        assert result[f"same_{name}"] == "True", name
        assert result[f"range_{name}"].split("+")[0] == address, name
    assert result["same_array"] == "True"
    assert result["remapped_vmm"] == "True"  # the handle it made with cuMemCreate names the moved memory
    assert (
        result["texture_names_array"] == result["later_texture_names_array"] == result["same_level"] == "True"
    )
    assert result["counter"] == "2"  # a function, a kernel and a graph ran on the moved memory
    assert result["event_query"] == "0"
    assert result["alloc_after"] == "0" and result["memset_after"] == "07070707"
    assert result["finished"] == "1"


@pytest.fixture
def worker():
    handle = _worker()
    yield handle
    handle.stop()


def test_a_lease_holding_every_object_kind_moves_and_keeps_addresses_and_contents(shim_dir, worker):
    """Migrating a running lease GPU 0 -> GPU 1: the worker reports the move and the bytes it copied; the
    process's allocations keep their addresses and bytes, and its contexts, module, library, function,
    kernel, stream, events, graph, pool and mapped memory work after it resumed, a CUDA array and a mipmapped
    array keep their bytes under the handles the program holds (their texture object names the array, so
    does one made after the move); moving back works too."""
    client = Client(shim_dir, worker)
    moved = worker.migrate(0, 1)
    assert moved["ok"], moved
    assert (moved["from"], moved["to"]) == (0, 1)
    assert moved["bytes"] >= 6 * MiB  # the three regions the client filled
    client.send("after the first move")
    client.until("step")
    back = worker.migrate(0, 0)
    assert back["ok"] and back["to"] == 0, back
    _assert_intact(client.finish())


def test_graphs_move_and_replay_as_before(shim_dir, worker):
    """A lease holding CUDA graphs — built node by node (memset, kernel, copy, child graph, event record, host
    and empty nodes), captured from a stream (a memset, a CUkernel's and a function's launches, a copy, a
    host function) and destroyed once instantiated, instantiated graphs whose nodes were set anew or switched off — moves
    GPU 0 -> 1 -> 0: each instantiated graph leaves the same bytes at the same addresses as before the
    moves, the graph instantiated anew does what it did before them, and the graph, node and instantiated-graph handles the program holds still answer (its nodes
    listed, a kernel node's function and attribute and an event node's event read back, a node set anew
    and run)."""
    client = Client(shim_dir, worker, "migrate_graphs")
    assert client.seen["distinct"] == "True"
    for to in (1, 0):
        moved = worker.migrate(0, to)
        assert moved["ok"], moved
        assert moved["objects"] >= 3 + 7 + 3  # at least the graphs, the graph's nodes, the instantiated ones
        client.send(f"moved to {to}")
        client.until("step")
    result = client.finish()
    for name in ("first", "second", "captured", "instantiated_anew", "nodes", "host_calls"):
        assert result[f"same_{name}"] == "True", name
    assert result["node_function"] == result["node_attribute"] == result["event_node"] == "True"
    assert result["set_after"] == "09020202"  # 0x02020202 + 7: the node set anew after the moves ran
    assert result["finished"] == "1"


def test_the_primary_context_s_references_are_as_in_an_unmigrated_run(shim_dir, worker):
    """A process holding two references to its device's primary context (flags set): after a move (and a move
    back) cuDevicePrimaryCtxGetState answers what it answers without a move, the context stays active after
    the first release and works, and the second release lets it go (inactive) — the references the program
    holds are the target's, neither one more (the move's own) nor fewer."""
    results = []
    for moves in ((), (1, 0)):
        client = Client(shim_dir, worker, "migrate_primary")
        for to in moves:
            moved = worker.migrate(0, to)
            assert moved["ok"], moved
            client.send(f"moved to {to}")
            client.until("step")
        results.append(client.finish())
    unmigrated, migrated = results
    assert unmigrated["state_after"] == "4/1" and unmigrated["state_all_released"] == "4/0", unmigrated
    for key in (
        "state_before",
        "state_after",
        "state_one_released",
        "works_one_released",
        "state_all_released",
    ):
        assert migrated[key] == unmigrated[key], (key, migrated, unmigrated)


def test_events_made_just_before_a_move_are_made_again_on_the_target(shim_dir, worker):
    """Events the worker's native loop made (the program's last calls before the move, so no call through
    Python has told Python's tables of them yet) are made again on the target by the move: they record,
    synchronise, time and destroy there as on a lease that did not move."""
    objects = []
    for extra in (0, 6):
        client = Client(shim_dir, worker, "migrate_events")
        client.send(f"events {extra}")
        client.until("made")
        moved = worker.migrate(0, 1 - len(objects))
        assert moved["ok"], moved
        objects.append(moved["objects"])
        client.send("moved")
        client.until("step")
        got = client.finish()
        assert (got["recorded"], got["destroyed"], got["after"]) == ("0,0,0,0", "0,0", "0,0,0"), got
    assert objects[1] - objects[0] >= 6, objects  # every event made, the six more too


def test_the_move_waits_for_the_call_running_then(shim_dir, worker):
    """A migration asked while the worker runs a long kernel of the lease waits until it has returned
    (the lease's streams are drained before the copy), then moves; the program goes on unharmed."""
    client = Client(shim_dir, worker)
    client.send("long")
    client.until("step")  # the 1.5 s kernel runs in the worker now
    moved = worker.migrate(0, 1)
    assert moved["ok"], moved
    assert moved["wait_s"] >= 0.5  # held until the kernel's 1.2 s left had passed, not copied under it
    _assert_intact(client.finish())


def test_what_cannot_move_is_refused_and_the_lease_keeps_running(shim_dir, worker):
    """A GPU this host does not have, the GPU the lease is on, a device the lease lacks, a stream
    capture in flight, a graph holding a node a move does not build (a captured stream write), and green
    contexts (partitions of this GPU's SMs) are each refused with a reason; the lease keeps running with its
    memory intact (and moves once it let go of the graph)."""
    client = Client(shim_dir, worker)
    for device, to in ((0, 7), (0, 0), (3, 1)):
        refused = worker.migrate(device, to)
        assert not refused["ok"] and refused["error"], (device, to)
    client.send("capture")
    client.until("capturing")
    during_capture = worker.migrate(0, 1)
    client.send("capture ends")
    client.until("step")
    assert not during_capture["ok"] and "capture" in during_capture["error"]
    client.send("memop graph")
    client.until("step")
    holding_memop = worker.migrate(0, 1)
    assert not holding_memop["ok"] and "stream memory operation" in holding_memop["error"]
    assert "failed" not in holding_memop["error"]  # refused up front, not a move that failed part-way
    client.send("memop graph ends")
    client.until("step")
    there = worker.migrate(0, 1)
    back = worker.migrate(0, 0) if there["ok"] else {}
    assert there["ok"] and back["ok"], (there, back)  # the graph let go of, the lease moves
    client.send("green")
    client.until("step")
    holding_green = worker.migrate(0, 1)
    assert not holding_green["ok"] and "green contexts" in holding_green["error"]
    _assert_intact(client.finish())


def test_a_lease_under_mps_is_refused(shim_dir):
    """A worker running as an MPS client cannot move its memory: refused up front, the lease runs on."""
    handle = _worker(CUDA_MPS_PIPE_DIRECTORY="/nonexistent/mps")
    try:
        client = Client(shim_dir, handle)
        refused = handle.migrate(0, 1)
        assert not refused["ok"] and "MPS" in refused["error"]
        _assert_intact(client.finish())
    finally:
        handle.stop()


def test_a_target_failing_mid_copy_leaves_the_lease_on_its_source(shim_dir):
    """The target GPU fails after part of the memory was copied: the migration reports the failure and
    the lease keeps running on its source, every byte intact; a later move to a healthy GPU works."""
    handle = _worker(GPUPOOL_HOST_EXECUTOR_GPUS="3", GPUPOOL_HOST_EXECUTOR_FAILING_GPUS="1")
    try:
        client = Client(shim_dir, handle)
        failed = handle.migrate(0, 1)
        assert not failed["ok"] and failed["error"]
        client.send("after the failed move")
        client.until("step")
        moved = handle.migrate(0, 2)
        assert moved["ok"] and moved["from"] == 0, moved  # still on GPU 0 after the failure
        _assert_intact(client.finish())
    finally:
        handle.stop()


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


def test_a_worker_sees_the_gpus_a_move_can_go_to_except_under_mps():
    """A worker whose GPUs have UUIDs (the pool's always do) is not narrowed to them, so a move can reach
    another GPU of the host (numbered as nvidia-smi numbers them); under MPS it sees exactly the lease's
    GPU, in the lease's order, as before."""
    devices = [WorkerDevice(0, "GPU-00000000-0000-0000-0000-000000000001", 64 * MiB)]
    free = start_worker("free-lease", devices, bind_host="127.0.0.1", env={}, executor="host")
    mps = start_worker("mps-lease", devices, bind_host="127.0.0.1", env={"CUDA_MPS_PIPE_DIRECTORY": "/nonexistent/mps"},
                       executor="host")  # fmt: skip
    try:
        seen = _environ(free.pid)
        assert seen.get("CUDA_VISIBLE_DEVICES") == os.environ.get(
            "CUDA_VISIBLE_DEVICES"
        )  # the server's, if any
        assert seen["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
        assert _environ(mps.pid)["CUDA_VISIBLE_DEVICES"] == devices[0].uuid
    finally:
        free.stop()
        mps.stop()
