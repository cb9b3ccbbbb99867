"""The console driven by real keystrokes (Textual Pilot) over real telemetry (Parquet + DuckDB)."""

from __future__ import annotations

import json
import socket
from datetime import timedelta

import pytest
from test_console_snapshots import ANSWERS as CANNED
from test_live_fixtures import T0, gpu_row, write_fleet, write_segment

from collector.schema import GPU_SAMPLES
from server.client import ServerClient, ServerClientOptions
from tui._format import MISSING
from tui._history import HistorySource
from tui._screens import HelpScreen
from tui._sources import Pool, TelemetryFleet
from tui.app import ConsoleApp

pytestmark = pytest.mark.anyio

NOW = T0 + timedelta(seconds=5)
SIZE = (150, 44)


def clock():
    return NOW


def make_app(tele=None, *, pool=None, history=True, **kwargs) -> ConsoleApp:
    fleet = TelemetryFleet([tele], label="telemetry: fleet") if tele else None
    return ConsoleApp(
        fleet=fleet,
        pool=pool,
        history=HistorySource([tele]) if tele and history else None,
        refresh_s=None,  # refreshes are driven by the test (or the `r` key)
        clock=clock,
        **kwargs,
    )


async def settle(pilot) -> None:
    """Wait until every worker finished and the messages they posted are handled."""
    for _ in range(4):
        await pilot.app.workers.wait_for_complete()
        await pilot.pause()


def shown(app, table_id: str) -> list[tuple[str, ...]]:
    table = app.query_one(f"#{table_id}")
    return [tuple(str(getattr(c, "plain", c)) for c in table._rows[k].cells) for k in table.shown_keys]


@pytest.fixture
def anyio_backend():
    return "asyncio"  # Textual runs on asyncio


@pytest.fixture
def tele(tmp_path):
    return write_fleet(tmp_path / "tele")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_fleet_lists_hosts_gpus_and_the_processes_of_the_selected_gpu(tele):
    app = make_app(tele)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        assert [r[0] for r in shown(app, "fleet-hosts")] == ["gpu-a", "gpu-b"]
        gpus = shown(app, "fleet-gpus")
        assert [(g[0], g[1]) for g in gpus] == [("gpu-a", "0"), ("gpu-a", "1"), ("gpu-b", "0")]
        assert gpus[0][3] == "95%" and gpus[0][5] == "57%"  # utilization and SM activity side by side
        assert gpus[0][7] == "76.0/80.0 GiB" and gpus[0][8] == "668 W" and gpus[0][9] == "68 °C"
        assert gpus[0][4].endswith("█")  # the sparkline ends at the top of the ramp
        assert app.focused.id == "fleet-gpus"
        assert [p[1] for p in shown(app, "fleet-procs")] == ["alice", "alice"]
        assert shown(app, "fleet-procs")[0][2] == "c0ffee123456"

        await pilot.press("down")  # to gpu-a GPU 1: bob's idle notebook
        await settle(pilot)
        assert shown(app, "fleet-procs") == [("5151", "bob", "–", "jupyter", "30,720 MiB", "0%")]
        assert app.query_one("#fleet-procs").border_title == "Processes on gpu-a GPU 1"
        status = str(app.query_one("#fleet-status").render())
        assert "newest sample 2026-03-02 12:00:00 UTC (5s ago)" in status and "SIMULATED" in status

        await pilot.press("shift+tab", "down", "enter")  # on the Hosts table: gpu-b, only its GPUs
        assert [(g[0], g[1]) for g in shown(app, "fleet-gpus")] == [("gpu-b", "0")]
        assert app.focused.id == "fleet-gpus" and app.query_one("#filter").value == "gpu-b"
        await pilot.press("escape")
        assert len(shown(app, "fleet-gpus")) == 3


async def test_filter_narrows_every_table_and_escape_clears_it(tele):
    app = make_app(tele)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("slash", *"alice c0ffee")  # words, all of them, in any column
        assert [p[0] for p in shown(app, "fleet-procs")] == ["4242"]
        await pilot.press("escape")
        assert len(shown(app, "fleet-procs")) == 2

        await pilot.press("2", "1", "slash", *"gpu-b")  # fast: the view switch must not steal the keys
        assert app.query_one("#filter").value == "gpu-b"
        assert [g[0] for g in shown(app, "fleet-gpus")] == ["gpu-b"]
        assert [h[0] for h in shown(app, "fleet-hosts")] == ["gpu-b"]
        await pilot.press("enter")  # keeps the filter, back in the table
        assert app.focused.id == "fleet-gpus"
        assert len(shown(app, "fleet-gpus")) == 1
        await pilot.press("escape")
        assert len(shown(app, "fleet-gpus")) == 3
        assert not app.query_one("#filter").display

        await pilot.press("slash", *"a/b")  # inside the filter, / is text
        assert app.query_one("#filter").value == "a/b"


async def test_sort_cycles_columns_by_value_and_reverses(tele):
    app = make_app(tele)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("s", "s", "s", "s")  # Host, #, Name, Util
        order = [(g[0], g[1]) for g in shown(app, "fleet-gpus")]
        assert order == [("gpu-a", "1"), ("gpu-b", "0"), ("gpu-a", "0")]  # 0%, 87%, 95%: numbers, not text
        await pilot.press("S")
        assert [(g[0], g[1]) for g in shown(app, "fleet-gpus")] == list(reversed(order))
        assert str(app.query_one("#fleet-gpus").columns["util"].label) == "Util ▼"


async def test_new_segments_update_cells_in_place_and_keep_the_cursor(tele):
    app = make_app(tele)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("down")
        table = app.query_one("#fleet-gpus")
        assert table.selected_key.endswith("GPU-gpu-a-1")
        later = T0 + timedelta(seconds=10)
        write_segment(tele, GPU_SAMPLES, [gpu_row("gpu-a", 1, later, 0.5)], name="seg-0002")
        await pilot.press("r")
        await settle(pilot)
        assert shown(app, "fleet-gpus")[1][3] == "50%"
        assert table.selected_key.endswith("GPU-gpu-a-1")  # the cursor stayed on the same GPU


async def test_history_shows_the_summary_and_idle_holders_and_changes_range(tele):
    app = make_app(tele)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("3")
        await settle(pilot)
        summary = dict(shown(app, "history-summary"))
        assert summary["hosts / GPUs"] == "2 / 3"
        assert summary["held while idle (memory in use)"].endswith("(33%)")  # gpu-a GPU 1 of three
        assert [u[0] for u in shown(app, "history-users")] == ["bob"]
        # The pool's lease events: who leased how much, and what idle reclaim took back.
        pool = {row[0]: row for row in shown(app, "history-pool")}
        assert pool["alice"][1:] == ("1", "0", "0", "0.07", "0.00")  # 2 x 0.25 for 8 minutes
        assert pool["bob"][3:] == ("1", "0.04", "0.04")  # 0.5 for 5 minutes, reclaimed
        assert pool["carol"][2] == "1"  # denied once
        title = app.query_one("#history-pool").border_title
        assert "2 granted, 1 denied, 1 released, 0 expired, 1 reclaimed" in title
        await pilot.press("left_square_bracket")
        await settle(pilot)
        assert app.query_one("#history-view").range_label == "6h"
        assert "range 6h" in str(app.query_one("#history-status").render())


async def test_help_and_command_palette(tele):
    app = make_app(tele)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("escape")
        assert not isinstance(app.screen, HelpScreen)
        await pilot.press("ctrl+p")
        await pilot.pause()
        await pilot.press(*"History view")
        await pilot.pause(0.3)
        await pilot.press("enter")
        await settle(pilot)
        assert app.query_one("#views").active == "history"


async def test_telemetry_only_pool_actions_say_why_they_cannot_run(tele):
    app = make_app(tele)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("2")
        await settle(pilot)
        assert "No pool servers" in str(app.query_one("#pool-status").render())
        app.action_release_lease()
        await pilot.pause()
        assert any("No pool servers" in n.message for n in app._notifications)


async def test_an_unreachable_server_is_shown_and_retried_never_a_crash():
    dead = f"http://127.0.0.1:{free_port()}"
    pool = Pool([ServerClient(dead, "admin-token", ServerClientOptions(timeout_s=1))], clock=clock)
    app = make_app(None, pool=pool)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        assert app.query_one("#views").active == "pool"  # only servers given: start there
        servers = shown(app, "pool-servers")
        assert servers[0][0] == dead and servers[0][1] == "unreachable 0s (1 try)"
        assert "Connection refused" in servers[0][-1]
        assert "1 unreachable (retrying)" in str(app.query_one("#pool-status").render())
        await pilot.press("r")  # a forced refresh retries at once
        await settle(pilot)
        assert shown(app, "pool-servers")[0][1] == "unreachable 0s (2 tries)"
        assert "No telemetry" in str(app.query_one("#fleet-status").render())


class OddServer(ServerClient):
    """A server of another version: some answers are not what the OpenAPI document says (not the
    ``server.api`` struct), others carry fields this console does not know."""

    def _call(self, method, path, body=None, *, auth=True):
        answers = json.loads(json.dumps(CANNED))  # the documented answers of the snapshot tests
        answers["/v1/health"]["added_later"] = {"any": "thing"}  # a newer server's field
        answers["/v1/leases"]["leases"][0]["added_later"] = 1
        answers["/v1/gpus"]["gpus"] = "not a list"
        answers["/v1/admin/policy"] = {}
        return answers[path.split("?")[0]]


async def test_unexpected_answers_are_reported_not_fatal():
    """An answer that is not its struct is reported on the server's row, naming the route, while the
    routes that answered as documented are still shown; fields a newer server adds are ignored."""
    pool = Pool([OddServer("http://odd:1", "t")], clock=clock)
    app = make_app(None, pool=pool)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        (srv,) = shown(app, "pool-servers")
        assert srv[1] == "ok" and "/v1/gpus" in srv[-1] and "GpuList" in srv[-1]
        assert srv[5] == MISSING  # no policy: its limit is not made up
        assert shown(app, "pool-gpus") == []
        assert [row[0] for row in shown(app, "pool-leases")] == ["lease-aaaa", "lease-bbbb"]
        assert [row[0] for row in shown(app, "pool-clients")] == ["alice", "bob"]


async def test_refreshes_under_an_open_dialog_keep_the_views_current(tele):
    app = make_app(tele)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("question_mark")
        write_segment(
            tele, GPU_SAMPLES, [gpu_row("gpu-b", 0, T0 + timedelta(seconds=10), 0.01)], name="seg-9"
        )
        app.refresh_all(force=True)
        await settle(pilot)
        assert isinstance(app.screen, HelpScreen)
        assert shown(app, "fleet-gpus")[2][3] == "1%"
