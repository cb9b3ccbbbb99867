"""The lease logic in-process (a real sqlite store, no HTTP): placement rules, fractions, retention."""

from __future__ import annotations

import msgspec
import pytest

from server._config import ServerConfig
from server._errors import Busy, Impossible
from server._events import EventLog
from server._inventory import GIB, MIB, Gpu, Inventory
from server._pool import Caller, Pool
from server._store import Store
from server.api import LeaseRequest

ALICE = Caller("alice", False)


def make_pool(tmp_path, sizes_gib, **cfg) -> Pool:
    gpus = tuple(
        Gpu(i, f"GPU-{i}", f"GPU{size}", size * GIB, "9.0", "550", "12.4") for i, size in enumerate(sizes_gib)
    )
    return Pool(
        Store(tmp_path / "pool.sqlite"),
        Inventory("h", "127.0.0.1", gpus, True),
        ServerConfig(**cfg),
        EventLog(None, "h", simulated=True),
    )


def gpus_of(lease) -> list[int]:
    return [p["gpu_index"] for p in lease["partitions"]]


def test_best_fit_fills_partial_gpus_first(tmp_path):
    pool = make_pool(tmp_path, [80, 80, 80])
    first = pool.grant(ALICE, LeaseRequest(n=1, fraction=0.5, filters=["device.id=1"]), now=0)
    assert gpus_of(first) == [1]
    # a quarter goes where it leaves the least free: next to the half, not on an empty GPU
    assert gpus_of(pool.grant(ALICE, LeaseRequest(n=1, fraction=0.25), now=0)) == [1]
    # a whole GPU still fits, because the partial ones were packed
    assert gpus_of(pool.grant(ALICE, LeaseRequest(n=2, fraction=1.0), now=0)) == [0, 2]


def test_mixed_gpu_sizes_give_every_partition_the_smallest_share(tmp_path):
    pool = make_pool(tmp_path, [80, 40])
    lease = pool.grant(ALICE, LeaseRequest(n=2, fraction=0.5), now=0)
    assert [p["mem_bytes"] for p in lease["partitions"]] == [20 * GIB, 20 * GIB]
    assert [p["fraction"] for p in lease["partitions"]] == [0.25, 0.5]  # what counts against limits
    assert lease["fraction_total"] == pytest.approx(0.75)


def test_mib_partitions_count_as_their_share_of_the_gpu_they_land_on(tmp_path):
    pool = make_pool(tmp_path, [80])
    lease = pool.grant(ALICE, LeaseRequest(n=1, mem_mib=20 * 1024), now=0)
    assert lease["partitions"][0]["mem_bytes"] == 20 * 1024 * MIB and lease["fraction_total"] == 0.25
    assert pool.usage("alice") == pytest.approx(0.25)


def test_busy_versus_impossible(tmp_path):
    pool = make_pool(tmp_path, [80, 80])
    pool.grant(ALICE, LeaseRequest(n=2, fraction=0.75), now=0)
    with pytest.raises(Busy):
        pool.grant(ALICE, LeaseRequest(n=1, fraction=0.5), now=0)
    with pytest.raises(Impossible, match="has 2"):
        pool.grant(ALICE, LeaseRequest(n=3, fraction=0.1), now=0)
    with pytest.raises(Impossible, match="can hold 100000 MiB"):
        pool.grant(ALICE, LeaseRequest(n=1, mem_mib=100_000), now=0)


def test_a_store_written_before_leases_carried_a_job_keeps_its_leases_and_takes_jobs(tmp_path):
    """A state directory of an older version (no job column) opens: its live lease reads back with no
    job, and a new lease stores the batch job it serves."""
    import sqlite3

    from server._store import SCHEMA

    old = SCHEMA.replace(",\n    job TEXT", "\n    ", 1)
    assert "job TEXT" not in old.split("CREATE INDEX")[0]
    db = sqlite3.connect(tmp_path / "pool.sqlite")
    db.executescript(old)
    db.execute("INSERT INTO leases(id, client, state, created, expires, ttl_s, last_active, local, remote)"
               " VALUES ('lease-old', 'alice', 'active', 0, 30, 30, 0, 0, 0)")  # fmt: skip
    db.commit()
    db.close()
    pool = make_pool(tmp_path, [80])
    assert pool.lease("lease-old")["job"] is None
    job = {"scheduler": "slurm/hpc", "id": "42", "account": "physics"}
    lease = pool.grant(ALICE, msgspec.convert({"n": 1, "fraction": 0.5, "job": job}, LeaseRequest), now=0)
    assert pool.lease(lease["id"])["job"] == job


def test_ended_leases_are_forgotten_after_the_retention(tmp_path):
    pool = make_pool(tmp_path, [80], ended_retention_s=100.0)
    old = pool.grant(ALICE, LeaseRequest(n=1, fraction=0.25), now=0)
    live = pool.grant(ALICE, LeaseRequest(n=1, fraction=0.25), now=0)
    pool.end(old["id"], "released", "released by its client", now=10)
    assert pool.purge_ended(now=50) == 0  # ended 40 s ago: kept
    assert pool.purge_ended(now=200) == 1
    assert [lease["id"] for lease in pool.list(ALICE, False, "any")] == [live["id"]]
    assert pool.used_bytes() == {0: 20 * GIB}


def test_the_example_configs_in_deploy_load(tmp_path):
    from pathlib import Path

    from server._config import load_config
    from server.client_config import load

    root = Path(__file__).resolve().parent.parent
    cfg = load_config(root / "deploy" / "server.toml")
    assert cfg.mps and cfg.clients["alice"].limit == 2.5 and cfg.clients["alice"].idle_timeout_s == 1800
    assert cfg.max_lease_s == 7 * 86400 and cfg.lease_ttl_s == 30
    client = load(str(root / "deploy" / "client.toml"))
    assert [s.url for s in client.servers] == [
        "http://gpu1.example.org:56001",
        "https://gpu2.example.org:56001",
    ]
    assert client.timeout_s == 600


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("[server]\nprot = 1\n", "unknown key server.prot"),
        ('[policy]\nlease_ttl = "soon"\n', "policy.lease_ttl: 'soon' is not a duration"),
        ("[sever]\n", "unknown section"),
        ("[server\n", "not valid TOML"),
        ('[server]\nport = "fifty"\n', "wrong type"),
        ("[clients]\nbob = 3\n", "wrong type"),
    ],
)
def test_config_mistakes_are_named(tmp_path, text, words):
    from server._config import load_config
    from server._errors import BadRequest

    path = tmp_path / "server.toml"
    path.write_text(text)
    with pytest.raises(BadRequest) as err:
        load_config(path)
    assert words in err.value.title


def test_a_lease_answer_carries_what_the_lease_itself_uses_of_each_gpu(tmp_path):
    """GET /v1/leases/ID's partitions say what the lease uses, for the NVML view of its runs: the
    memory and busy share of the lease's own processes in the newest sample (not its neighbours'),
    the GPU's temperature, power and SM clock; a remote lease's memory is what its worker says it holds."""
    import json
    import os
    import subprocess
    import sys

    pool = make_pool(tmp_path, [80])
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])  # the lease's process
    try:
        mine = pool.grant(ALICE, LeaseRequest(n=1, fraction=0.5, local=True, pids=[os.getpid()]), now=0)
        pool.live = {0: {"temperature_c": 41.0, "power_w": 250.0, "sm_clock_hz": 1.98e9}}
        # the lease's process, one it started (a data loader), and another tenant's
        pool.live_procs = {0: {os.getpid(): (3 * GIB, 0.25), child.pid: (GIB, 0.5), 999999: (7 * GIB, 0.75)}}
        usage = pool.lease(mine["id"], usage=True)["partitions"][0]["usage"]
        assert usage == {"mem_used_bytes": 4 * GIB, "util_gpu": 0.75, "temperature_c": 41.0, "power_w": 250.0,
                         "sm_clock_mhz": 1980}  # fmt: skip
        pool.live_procs = {0: {os.getpid(): (3 * GIB, None)}}  # no per-process utilization (MIG)
        assert pool.lease(mine["id"], usage=True)["partitions"][0]["usage"]["util_gpu"] is None

        remote = pool.grant(ALICE, LeaseRequest(n=1, fraction=0.25, remote=True), now=0)
        state = tmp_path / "worker"
        state.mkdir()
        (state / "usage").write_text(json.dumps([5 * GIB]))
        pool.set_worker(
            remote["id"], {"host": "h", "port": 1, "secret": "s", "pid": 1, "state_dir": str(state)}
        )
        assert pool.lease(remote["id"], usage=True)["partitions"][0]["usage"]["mem_used_bytes"] == 5 * GIB
        assert "usage" not in pool.lease(remote["id"])["partitions"][0]  # only where asked: the owner's GET
    finally:
        child.kill()
        child.wait()


def test_a_server_owns_only_the_gpus_its_cuda_visible_devices_names_as_cuda_would():
    """Two gpupool-servers on one host can split its GPUs: CUDA_VISIBLE_DEVICES by index or by UUID
    (or a UUID's unique start), in the order named; the list ends at the first entry that names none."""
    from server._inventory import visible

    gpus = [Gpu(i, f"GPU-{i}a{i}", "H100", 80 * GIB, "9.0", "550", "12.4") for i in range(4)]
    assert visible(gpus, None) == gpus
    assert [g.index for g in visible(gpus, "1")] == [1]
    assert [g.index for g in visible(gpus, "3,GPU-0a0")] == [3, 0]
    assert [g.index for g in visible(gpus, "GPU-2")] == [2]
    assert [g.index for g in visible(gpus, "2,7,1")] == [2]  # 7 names no GPU: the list ends there
    assert [g.index for g in visible(gpus, "GPU-")] == []  # names every GPU: none
    assert visible(gpus, "") == []


def test_a_leases_partitions_carry_their_gpus_nvlinks_through_the_api_into_the_nvml_view(tmp_path):
    """A GPU's active NVLinks (from the server's NVML) reach the client in the lease answer, typed, and
    the NVML view of the lease's runs lists them per device (NCCL's topology comes from there); a GPU
    without NVLink has none."""
    from collector import NvLink
    from server.api import Lease, answer, read
    from virtualize.client._nvml_view import render

    buses = ["00000000:19:00.0", "00000000:1A:00.0", "00000000:3B:00.0"]
    links = [
        tuple(NvLink(k, buses[1], 6) for k in range(4)),
        tuple(NvLink(k, buses[0], None if k == 3 else 6) for k in range(4)),
        (),
    ]
    gpus = tuple(
        Gpu(i, f"GPU-{i}", "H100", 80 * GIB, "9.0", "580", "13.0", pci_bus_id=buses[i], nvlinks=links[i])
        for i in range(3)
    )
    pool = Pool(
        Store(tmp_path / "pool.sqlite"),
        Inventory("h", "127.0.0.1", gpus, False),
        ServerConfig(),
        EventLog(None, "h", simulated=False),
    )
    granted = pool.grant(ALICE, LeaseRequest(n=3, fraction=1.0), now=0)
    lease = read(answer(Lease, pool.lease(granted["id"])), Lease)
    got = {
        p.gpu_index: [(n.link, n.remote_pci_bus_id, n.version) for n in p.nvlinks] for p in lease.partitions
    }
    assert got == {i: [(n.link, n.remote_pci_bus_id, n.version) for n in links[i]] for i in range(3)}
    blocks = render(lease).split("device ")[1:]
    view = {
        int(b.split("\n")[0]): [line for line in b.splitlines() if line.startswith("nvlink ")] for b in blocks
    }
    number = {p.gpu_index: n for n, p in enumerate(lease.partitions)}
    assert view[number[0]] == [f"nvlink {k} {buses[1]} 6" for k in range(4)]
    assert view[number[1]] == [f"nvlink {k} {buses[0]}" + ("" if k == 3 else " 6") for k in range(4)]
    assert view[number[2]] == []
