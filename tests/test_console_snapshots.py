"""Snapshots of the console's main screens at a fixed terminal size, over fixed data and a frozen clock.

Update after an intended change of layout: pytest tests/test_console_snapshots.py --snapshot-update
(then look at the SVGs in tests/__snapshots__/ before committing them).
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from test_live_fixtures import T0, write_fleet

from server.client import ServerClient, Unreachable
from tui._history import HistorySource
from tui._sources import Pool, TelemetryFleet
from tui.app import ConsoleApp

SIZE = (150, 44)
NOW = T0 + timedelta(seconds=5)
GIB = 1 << 30


def clock():
    return NOW


def iso(delta_s: float) -> str:
    return (T0 + timedelta(seconds=delta_s)).strftime("%Y-%m-%dT%H:%M:%SZ")


SERVER = {
    "hostname": "gpu-a",
    "addr": "10.0.0.11",
    "port": 56001,
    "version": "0.1.0",
    "simulated": True,
    "mps": False,
    "gpu_count": 2,
}


def _lease(lid: str, client: str, fractions: list[float], age_s: float, idle_s: float, label=None) -> dict:
    return {
        "id": lid,
        "client": client,
        "state": "active",
        "created_at": iso(-age_s),
        "last_active_at": iso(-idle_s),
        "expires_at": iso(25),
        "ttl_s": 30,
        "idle_timeout_s": 1800,
        "label": label,
        "simulated": True,
        "server": SERVER,
        "partitions": [
            {
                "gpu_index": i,
                "gpu_uuid": f"GPU-{i}",
                "gpu_name": "H100",
                "mem_bytes": int(f * 80 * GIB),
                "fraction": f,
            }
            for i, f in enumerate(fractions)
        ],
        "fraction_total": sum(fractions),
    }


ANSWERS: dict[str, Any] = {
    "/v1/health": {
        "status": "ok",
        "server": SERVER,
        "simulated": True,
        "leases_active": 2,
        "store": {"writable": True, "unsaved_leases": 0},
    },
    "/v1/gpus": {
        "server": SERVER,
        "simulated": True,
        "gpus": [
            {
                "index": 0,
                "uuid": "GPU-0",
                "name": "NVIDIA H100 80GB (simulated)",
                "mem_total_bytes": 80 * GIB,
                "mem_free_bytes": 20 * GIB,
                "free_fraction": 0.25,
                "partitions": [
                    {"lease_id": "lease-aaaa", "client": "alice", "mem_bytes": 20 * GIB, "fraction": 0.25},
                    {"lease_id": "lease-bbbb", "client": "bob", "mem_bytes": 40 * GIB, "fraction": 0.5},
                ],
            },
            {
                "index": 1,
                "uuid": "GPU-1",
                "name": "NVIDIA H100 80GB (simulated)",
                "mem_total_bytes": 80 * GIB,
                "mem_free_bytes": 60 * GIB,
                "free_fraction": 0.75,
                "partitions": [
                    {"lease_id": "lease-aaaa", "client": "alice", "mem_bytes": 20 * GIB, "fraction": 0.25}
                ],
            },
        ],
    },
    "/v1/leases": {
        "leases": [
            _lease("lease-aaaa", "alice", [0.25, 0.25], 3600, 20, "python train.py"),
            _lease("lease-bbbb", "bob", [0.5], 7200, 1500),
        ]
    },
    "/v1/admin/clients": {
        "clients": [
            {
                "client": "alice",
                "limit": 2.0,
                "limit_source": "default",
                "idle_timeout_s": 1800,
                "idle_timeout_source": "default",
                "usage": 0.5,
                "leases_active": 1,
            },
            {
                "client": "bob",
                "limit": 0.5,
                "limit_source": "client",
                "idle_timeout_s": 3600,
                "idle_timeout_source": "client",
                "usage": 0.5,
                "leases_active": 1,
            },
        ]
    },
    "/v1/admin/policy": {
        "default_limit": 2.0,
        "default_idle_timeout_s": 1800,
        "max_lease_s": None,
        "lease_ttl_s": 30,
        "max_leases_per_client": 32,
        "max_workers_per_client": 8,
    },
}


class CannedServer(ServerClient):
    """A pool server's documented answers (each decodes as its server.api struct), fixed: the seam is
    ServerClient._call (HTTP is tested elsewhere)."""

    def _call(self, method: str, path: str, body=None, *, auth: bool = True):
        return json.loads(json.dumps(ANSWERS[path.split("?")[0]]))


class DeadServer(ServerClient):
    def _call(self, method: str, path: str, body=None, *, auth: bool = True):
        reason = "[Errno 111] Connection refused"
        raise Unreachable(
            self.url, reason, title=f"{self.url} unreachable: {reason}", hint="is gpupool-server running?"
        )


@pytest.fixture
def tele(tmp_path):
    return write_fleet(tmp_path / "tele")


def app_for(tele=None, *, pool=False, view=None) -> ConsoleApp:
    servers = Pool(
        [CannedServer("http://gpu-a:56001", "t"), DeadServer("http://gpu-b:56001", "t")], clock=clock
    )
    return ConsoleApp(
        fleet=TelemetryFleet([tele], label="telemetry: /var/lib/gpupool/telemetry") if tele else None,
        history=HistorySource([tele]) if tele else None,
        pool=servers if pool else None,
        refresh_s=None,
        clock=clock,
        start_view=view,
    )


async def settled(pilot) -> None:
    for _ in range(4):
        await pilot.app.workers.wait_for_complete()
        await pilot.pause()
    await pilot.pause(0.1)


def test_fleet_view(snap_compare, tele):
    assert snap_compare(app_for(tele, pool=True), terminal_size=SIZE, run_before=settled)


def test_pool_view(snap_compare, tele):
    assert snap_compare(app_for(tele, pool=True, view="pool"), terminal_size=SIZE, run_before=settled)


def test_history_view(snap_compare, tele):
    assert snap_compare(app_for(tele, view="history"), terminal_size=SIZE, run_before=settled)


def test_release_confirmation(snap_compare):
    async def open_dialog(pilot):
        await settled(pilot)
        await pilot.press("x")
        await pilot.pause()

    assert snap_compare(app_for(pool=True), terminal_size=SIZE, run_before=open_dialog)


def test_migrate_dialog(snap_compare):
    async def open_dialog(pilot):
        await settled(pilot)
        await pilot.press("down", "m")  # bob's lease, on GPU 0: GPU 1 is the one to offer
        await pilot.pause()

    assert snap_compare(app_for(pool=True), terminal_size=SIZE, run_before=open_dialog)


def test_help(snap_compare):
    async def open_help(pilot):
        await settled(pilot)
        await pilot.press("question_mark")
        await settled(pilot)  # Markdown lays itself out in steps
        await pilot.pause(0.3)

    # Nothing behind the dialog: what shows through is not what this snapshot is about.
    assert snap_compare(ConsoleApp(refresh_s=None, clock=clock), terminal_size=SIZE, run_before=open_help)
