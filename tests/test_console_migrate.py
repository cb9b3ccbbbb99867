"""The console's live-migration actions (`m` on a lease, `d` on a GPU) against a real gpupool-server whose
lease workers run the host executor, with a real program under `gpuattach run` holding device memory."""

from __future__ import annotations

import contextlib

import msgspec
import pytest
from pool_harness import ServerProc, api, killed_on_failure
from test_console import settle, shown
from test_console_pool import SIZE, focus_row
from test_console_snapshots import GIB, _lease
from test_pool_migrate import partitions, start_program

from server.api import Gpu, Lease
from server.client import HttpTransport, Reply, ServerClient, ServerClientOptions
from tui._screens import ConfirmScreen, MigrateScreen, migration_choices
from tui._sources import Pool
from tui.app import ConsoleApp

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120), pytest.mark.needs("native")]


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    # Three GPUs: the dialog has a choice to make (the server tells its host-executor workers the count).
    env = {"GPUPOOL_WORKER_EXECUTOR": "host"}
    srv = ServerProc(tmp_path_factory.mktemp("console-migrate"), "3xH100-80GB", env=env).start()
    yield srv
    srv.stop()


class RecordingTransport(HttpTransport):
    """The real HTTP transport, noting each request (method, path): what the console sent."""

    def __init__(self, url: str, **kwargs):
        super().__init__(url, **kwargs)
        self.sent: list[tuple[str, str]] = []

    def exchange(self, method: str, path: str, body: bytes | None, headers: dict[str, str]) -> Reply:
        self.sent.append((method, path))
        return super().exchange(method, path, body, headers)


def make_app(server: ServerProc, token: str | None) -> ConsoleApp:
    pool = Pool([ServerClient(server.url, token, ServerClientOptions(timeout_s=5))])
    return ConsoleApp(pool=pool, refresh_s=None)


def status_line(app) -> str:
    return str(app.query_one("#pool-status").render())


def finish(run) -> str:
    out, err = run.communicate("done\n", timeout=60)
    assert run.returncode == 0, out + err
    return out


async def test_migrate_a_running_lease_from_the_leases_table(server, tmp_path):
    """`m` on a running remote lease offers the server's other GPUs, the one with the most free memory
    highlighted; enter moves the lease there (its partition is on that GPU in the API afterwards), the
    status line says from → to with the pause, and the program finishes with its memory intact."""
    admin = server.token("ops", admin=True)
    run, lease = start_program(server, tmp_path, "mover", admin)
    try:
        (source,) = partitions(server, admin, lease["id"])
        _, view = api(server.url, "GET", "/v1/gpus", admin)
        roomiest = max((g for g in view["gpus"] if g["index"] != source), key=lambda g: g["mem_free_bytes"])
        app = make_app(server, admin)
        async with app.run_test(size=SIZE) as pilot:
            await settle(pilot)
            await focus_row(pilot, "pool-leases", lease["id"])
            await pilot.press("m")
            assert isinstance(app.screen, MigrateScreen)
            assert sorted(c.target.index for c in app.screen.choices) == sorted(
                g["index"] for g in view["gpus"] if g["index"] != source
            )
            assert app.screen.choices[0].target.index == roomiest["index"]  # highlighted: enter takes it
            await pilot.press("enter")
            await settle(pilot)
            assert partitions(server, admin, lease["id"]) == [roomiest["index"]]
            what, error = app.action_log[-1]
            assert error is None and lease["id"] in what
            assert f"GPU {source} → GPU {roomiest['index']}" in status_line(app) and "paused" in status_line(
                app
            )
            gpus = {row[1]: row[4] for row in shown(app, "pool-gpus")}  # refreshed after the move
            assert lease["id"] in gpus[str(roomiest["index"])] and lease["id"] not in gpus[str(source)]
        out = finish(run)
    finally:
        if run.poll() is None:
            run.kill()
    assert "same_plain True" in out and "finished 1" in out


async def test_a_refused_migration_shows_the_servers_reason_and_changes_nothing(server):
    """A lease that cannot move (a local lease: its own process holds the GPU state) is refused: the
    status line carries the server's reason, the lease stays on its GPU, the console keeps running."""
    admin = server.token("ops", admin=True)
    status, local = api(server.url, "POST", "/v1/leases", server.token("local-one"), {"n": 1, "mem_mib": 256})
    assert status == 201, local
    before = partitions(server, admin, local["id"])
    app = make_app(server, admin)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await focus_row(pilot, "pool-leases", local["id"])
        await pilot.press("m", "enter")
        await settle(pilot)
        what, error = app.action_log[-1]
        assert (
            local["id"] in what and error is not None and "not remote" in error and "Traceback" not in error
        )
        assert "not remote" in status_line(app)
        assert partitions(server, admin, local["id"]) == before
        await pilot.press("r")  # still alive and answering keys
        await settle(pilot)
        assert local["id"] in [row[0] for row in shown(app, "pool-leases")]
    api(server.url, "DELETE", f"/v1/leases/{local['id']}", admin)


async def test_without_an_admin_token_the_keys_say_so_and_send_nothing(server):
    """Without an admin token, `m` and `d` each answer with one notice naming the missing token; no
    dialog opens and no request other than the health check reaches the server."""
    transport = RecordingTransport(server.url, timeout_s=5)
    app = ConsoleApp(pool=Pool([ServerClient(server.url, None, transport=transport)]), refresh_s=None)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("m")
        assert not isinstance(app.screen, (MigrateScreen, ConfirmScreen))
        await pilot.press("d")
        assert not isinstance(app.screen, (MigrateScreen, ConfirmScreen))
        await settle(pilot)
        assert [n.title for n in app._notifications].count("No admin token") == 2  # one per key
        assert all(path == "/v1/health" for _, path in transport.sent), transport.sent


async def test_drain_a_gpu_from_the_gpu_table_and_undo_it(server, tmp_path):
    """`d` on the GPU of a running remote lease, confirmed: the lease moves to another GPU, a local
    lease there stays and the status line names it (partly done), the GPU is shown as draining and
    the API reports it so; `d` again, confirmed, makes it take leases again."""
    admin = server.token("ops", admin=True)
    run, lease = start_program(server, tmp_path, "drained", admin)
    # A local lease on every GPU, so on the drained one too: it cannot move.
    status, local = api(server.url, "POST", "/v1/leases", server.token("local-all"), {"n": 3, "mem_mib": 256})
    assert status == 201, local
    try:
        (gpu,) = partitions(server, admin, lease["id"])
        app = make_app(server, admin)
        async with app.run_test(size=SIZE) as pilot:
            await settle(pilot)
            _, view = api(server.url, "GET", "/v1/gpus", admin)
            uuid = next(g["uuid"] for g in view["gpus"] if g["index"] == gpu)
            await focus_row(pilot, "pool-gpus", uuid)
            await pilot.press("d")
            assert isinstance(app.screen, ConfirmScreen)
            await pilot.press("y")
            await settle(pilot)
            assert partitions(server, admin, lease["id"]) != [gpu]
            _, view = api(server.url, "GET", "/v1/gpus", admin)
            assert [g["index"] for g in view["gpus"] if g["draining"]] == [gpu]
            row = next(r for r in shown(app, "pool-gpus") if r[1] == str(gpu))
            assert row[3].startswith("draining")
            assert f"{local['id']} stays" in status_line(app)
            assert any(n.severity == "warning" and n.title == "Partly done" for n in app._notifications)
            await pilot.press("d", "y")  # the same row: it is draining, so this undoes it
            await settle(pilot)
            _, view = api(server.url, "GET", "/v1/gpus", admin)
            assert not any(g["draining"] for g in view["gpus"])
            row = next(r for r in shown(app, "pool-gpus") if r[1] == str(gpu))
            assert not row[3].startswith("draining")
        out = finish(run)
    finally:
        if run.poll() is None:
            run.kill()
        api(server.url, "DELETE", f"/v1/leases/{local['id']}", admin)
    assert "same_plain True" in out and "finished 1" in out


def test_the_dialog_offers_each_partition_every_gpu_the_lease_does_not_hold_roomiest_first():
    """For a lease on GPUs 0 and 2 of four, the choices are both partitions to GPUs 1 and 3 (never one
    the lease holds), the GPU with the most free memory first, a draining GPU after every other."""
    answer = _lease("lease-x", "alice", [0.25, 0.25], 60, 1)
    answer["partitions"][1]["gpu_index"] = 2
    lease = msgspec.convert(answer, Lease)

    def gpu(index: int, free_gib: int, draining: bool = False) -> Gpu:
        return Gpu(index=index, uuid=f"GPU-{index}", name="H100", mem_total_bytes=80 * GIB,
                   mem_free_bytes=free_gib * GIB, free_fraction=free_gib / 80, draining=draining)  # fmt: skip

    choices = migration_choices(lease, [gpu(0, 10), gpu(1, 80, draining=True), gpu(2, 10), gpu(3, 40)])
    assert [(c.partition, c.source, c.target.index) for c in choices] == [
        (0, 0, 3),
        (1, 2, 3),
        (0, 0, 1),
        (1, 2, 1),
    ]
    assert "draining" in choices[-1].label and "GPU 0 → GPU 3" in choices[0].label


@contextlib.asynccontextmanager
async def two_servers_watched(tmp_path, client: str):
    """Two real servers (one simulated GPU each, host-executor workers) and a console watching both with an
    admin token both take; a program under gpuattach on the first, holding what a move to another server
    carries. Yields (a, b, admin, lease, app, pilot); the program must finish intact afterwards."""
    from test_pool_migrate_server import HOST, admin_of, finishes_intact
    from test_pool_migrate_server import start_program as start_movable

    a = ServerProc(tmp_path / "a", "1xH100-80GB", env=HOST).start()
    b = ServerProc(tmp_path / "b", "1xH100-80GB", env=HOST).start()
    try:
        admin = admin_of(a, b)
        token = a.token(client)
        b.token(client, token=token)  # the program's heartbeats follow the lease to B
        run, lease = start_movable(a, tmp_path, client, admin, token=token)
        pool = Pool([ServerClient(s.url, admin, ServerClientOptions(timeout_s=5)) for s in (a, b)])
        app = ConsoleApp(pool=pool, refresh_s=None)
        with killed_on_failure(run):
            async with app.run_test(size=SIZE) as pilot:
                await settle(pilot)
                yield a, b, admin, lease, app, pilot
        finishes_intact(run)
    finally:
        a.stop()
        b.stop()


async def test_migrate_a_running_lease_to_another_watched_server(tmp_path):
    """With two servers watched, `m` on a running remote lease also offers the other server (after the
    GPUs of its own); enter on it moves the whole lease there, live, as `lease migrate --to SERVER`: the
    lease is active on the other server afterwards, the status line names it with the pause, and the
    program finishes there with its memory and handles intact."""
    from tui._screens import ServerChoice

    async with two_servers_watched(tmp_path, "traveller") as (_, b, admin, lease, app, pilot):
        await focus_row(pilot, "pool-leases", lease["id"])
        await pilot.press("m")
        assert isinstance(app.screen, MigrateScreen)
        targets = [c.url for c in app.screen.choices if isinstance(c, ServerChoice)]
        assert targets == [b.url]  # its own server's one GPU is held: the other server only
        await pilot.press("enter")
        await settle(pilot)
        what, error = app.action_log[-1]
        assert error is None and lease["id"] in what, error
        assert b.url in status_line(app) and "paused" in status_line(app)
        assert api(b.url, "GET", f"/v1/leases/{lease['id']}", admin)[1]["state"] == "active"


async def test_draining_a_server_moves_its_running_lease_to_another_watched_server(tmp_path):
    """With two servers watched, `d` `y` on a server's row drains it and moves its running remote lease,
    live, to the other server (the dialog names where leases go): the lease is active there afterwards,
    the status line names the move and its pause, the drained server grants nothing new, and the program
    finishes intact."""
    async with two_servers_watched(tmp_path, "drained-program") as (a, b, admin, lease, app, pilot):
        await focus_row(pilot, "pool-servers", a.url)
        await pilot.press("d")
        assert isinstance(app.screen, ConfirmScreen) and b.url in app.screen.question
        await pilot.press("y")
        await settle(pilot)
        _, error = app.action_log[-1]
        assert error is None, error
        assert api(a.url, "GET", "/v1/health")[1]["server"]["draining"] is True
        assert api(b.url, "GET", f"/v1/leases/{lease['id']}", admin)[1]["state"] == "active"
        assert f"{lease['id']} →" in status_line(app) and "paused" in status_line(app)
