"""The console's Pool view and operator actions against a real `gpupool-server --simulate-gpus` process."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from test_console import settle, shown

from server.client import PoolClientError, ServerClient, ServerClientOptions
from tui._screens import ConfirmScreen, PromptScreen
from tui._sources import Pool
from tui.app import ConsoleApp

pytestmark = pytest.mark.anyio
SIZE = (160, 48)


@pytest.fixture
def anyio_backend():
    return "asyncio"


def _server_cmd(*args: str) -> list[str]:
    script = Path(sys.executable).parent / "gpupool-server"
    if script.exists():
        return [str(script), *args]
    return [sys.executable, "-c", "import sys; from server.cli import main; sys.exit(main())", *args]


class Server:
    """A real gpupool-server on a free loopback port, with an admin token and two client tokens."""

    def __init__(self, state: Path, *extra: str):
        self.state = state
        state.mkdir(parents=True, exist_ok=True)  # token create needs the server's state directory
        self.tokens = {name: self._token(name, admin=name == "ops") for name in ("ops", "alice", "bob")}
        self.proc = subprocess.Popen(
            _server_cmd(
                "serve",
                "--simulate-gpus",
                "4xH100-80GB",
                "--host",
                "127.0.0.1",
                "--port",
                "0",
                "--state-dir",
                str(state),
                "--lease-ttl",
                "1h",
                "--idle-timeout",
                "30m",
                "--default-limit",
                "2",
                *extra,
            ),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.url = self._wait_listening(timeout=20)

    def _token(self, client: str, *, admin: bool) -> str:
        args = ["token", "create", "--state-dir", str(self.state), client] + (["--admin"] if admin else [])
        out = subprocess.run(_server_cmd(*args), capture_output=True, text=True, timeout=30, check=True)
        return out.stdout.strip().splitlines()[-1]

    def _wait_listening(self, timeout: float) -> str:
        found: list[str] = []
        seen: list[str] = []

        def read():
            for line in self.proc.stdout:
                seen.append(line)
                match = re.search(r"listening on (https?://\S+)", line)
                if match and not found:
                    found.append(match.group(1))

        threading.Thread(target=read, daemon=True).start()  # keeps draining the log afterwards
        deadline = time.monotonic() + timeout
        while not found and time.monotonic() < deadline and self.proc.poll() is None:
            time.sleep(0.05)
        if not found:
            self.stop()
            pytest.fail("gpupool-server did not start:\n" + "".join(seen))
        return found[0]

    def call(self, method: str, path: str, token: str, body: dict | None = None) -> dict:
        assert self.url.startswith("http://"), "test helper speaks plain HTTP"
        req = urllib.request.Request(
            self.url + path,
            data=json.dumps(body).encode() if body is not None else None,
            headers={"Authorization": f"Bearer {self.tokens[token]}", "Content-Type": "application/json"},
            method=method,
        )
        with urllib.request.urlopen(req, timeout=10) as resp:
            return json.loads(resp.read())

    def lease(self, client: str, n: int, fraction: float, label: str | None = None) -> str:
        body = {"n": n, "fraction": fraction, "ttl_s": 3600}
        if label:
            body["label"] = label
        return self.call("POST", "/v1/leases", client, body)["id"]

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)


@pytest.fixture
def server(tmp_path):
    srv = Server(tmp_path / "state")
    yield srv
    srv.stop()


def make_app(server: Server, token: str | None = "ops") -> ConsoleApp:
    tok = server.tokens[token] if token else None
    pool = Pool([ServerClient(server.url, tok, ServerClientOptions(timeout_s=5))])
    return ConsoleApp(pool=pool, refresh_s=None)


async def focus_row(pilot, table_id: str, key_part: str) -> None:
    """Focus a table with tab, as a user would, then move the cursor down to the row."""
    app = pilot.app
    for _ in range(8):
        if app.focused is not None and app.focused.id == table_id:
            break
        await pilot.press("tab")
    table = app.query_one(f"#{table_id}")
    assert app.focused is table
    for _ in range(len(table.shown_keys)):
        if key_part in (table.selected_key or ""):
            return
        await pilot.press("down")
    assert key_part in (table.selected_key or ""), f"{key_part} not in {table.shown_keys}"


async def test_pool_view_shows_servers_partitions_leases_and_clients(server):
    alice = server.lease("alice", 2, 0.25, label="python train.py")
    bob = server.lease("bob", 1, 0.5)
    app = make_app(server)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        assert app.query_one("#views").active == "pool"
        (srv,) = shown(app, "pool-servers")
        assert srv[0] == server.url and srv[1] == "ok" and srv[3] == "4" and srv[4] == "2"
        assert srv[5] == "2" and srv[6] == "30m00s" and "simulated" in srv[7]
        gpus = shown(app, "pool-gpus")
        assert len(gpus) == 4
        assert any(f"{alice} alice 0.25" in g[4] and f"{bob} bob 0.5" in g[4] for g in gpus)
        assert sum(g[4] == "free" for g in gpus) == 2  # two partitions of alice, bob beside one of them
        leases = {row[0]: row for row in shown(app, "pool-leases")}
        assert leases[alice][1] == "alice" and leases[alice][3] == "2 × 0.25 (40,960 MiB)"
        assert leases[alice][5].endswith("/ 30m00s") and leases[alice][7] == "python train.py"
        assert leases[bob][3] == "1 × 0.5 (40,960 MiB)"
        clients = {row[0]: row for row in shown(app, "pool-clients")}
        assert clients["alice"][2] == "0.5 / 2 (default)" and clients["bob"][2] == "0.5 / 2 (default)"
        assert "SIMULATED GPUs" in str(app.query_one("#pool-status").render())


async def test_release_a_lease_with_confirmation_through_the_keyboard(server):
    keep = server.lease("alice", 1, 0.25)
    gone = server.lease("bob", 1, 0.5)
    app = make_app(server)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await focus_row(pilot, "pool-leases", gone)
        await pilot.press("x")
        assert isinstance(app.screen, ConfirmScreen)
        assert gone in app.screen.question and "bob" in app.screen.question
        await pilot.press("n")  # cancel first: nothing happens
        await settle(pilot)
        assert server.call("GET", f"/v1/leases/{gone}", "ops")["state"] == "active"

        await pilot.press("x")
        await pilot.press("y")
        await settle(pilot)
        ended = server.call("GET", f"/v1/leases/{gone}", "ops")
        assert ended["state"] == "released"
        assert app.action_log[-1] == (f"released lease {gone}", None)
        assert [row[0] for row in shown(app, "pool-leases")] == [keep]  # refreshed after the action


async def test_set_limit_and_idle_timeouts_through_prompts(server):
    server.lease("alice", 1, 0.25)
    app = make_app(server)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await focus_row(pilot, "pool-clients", "alice")
        await pilot.press("l")
        assert isinstance(app.screen, PromptScreen)
        await pilot.press(*"lots", "enter")  # refused in the dialog, with the reason
        assert "not a number" in str(app.screen.query_one("#prompt-error").render())
        await pilot.press(*["backspace"] * 4, *"inf", "enter")  # the servers' range, checked in the dialog
        assert "inf is out of range" in str(app.screen.query_one("#prompt-error").render())
        await pilot.press(*["backspace"] * 3, *"1.5", "enter")
        await settle(pilot)
        await pilot.press("i", *"45m", "enter")
        await settle(pilot)
        alice = next(
            c for c in server.call("GET", "/v1/admin/clients", "ops")["clients"] if c["client"] == "alice"
        )
        assert alice["limit"] == 1.5 and alice["limit_source"] == "client"
        assert alice["idle_timeout_s"] == 2700 and alice["idle_timeout_source"] == "client"
        clients = {row[0]: row for row in shown(app, "pool-clients")}
        assert clients["alice"][2] == "0.25 / 1.5" and clients["alice"][4] == "45m00s"

        await focus_row(pilot, "pool-servers", server.url)
        await pilot.press("I", *"2h", "enter")
        await settle(pilot)
        assert server.call("GET", "/v1/admin/policy", "ops")["default_idle_timeout_s"] == 7200
        assert shown(app, "pool-servers")[0][6] == "2h00m"


async def test_a_failed_action_says_why_and_the_console_carries_on(server):
    lease = server.lease("alice", 1, 0.25)
    app = make_app(server)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await focus_row(pilot, "pool-leases", lease)
        server.stop()  # the server goes away between the screen and the key press
        await pilot.press("x", "y")
        await settle(pilot)
        what, error = app.action_log[-1]
        assert what == f"released lease {lease}"
        assert error is not None and "unreachable" in error and "Connection refused" in error
        assert any(n.severity == "error" and n.title == "Action failed" for n in app._notifications)
        assert shown(app, "pool-servers")[0][1].startswith("unreachable")  # and the view says so too


async def test_drain_a_server_from_the_servers_table_and_undo_it(server):
    """`d` on the servers table, confirmed, drains the server (the API says draining; its row and its GPUs
    show draining; the status line names the lease that stays, partly done); `d` again undoes it (ok)."""
    alice = server.lease("alice", 1, 0.25)
    app = make_app(server)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await focus_row(pilot, "pool-servers", server.url)
        await pilot.press("d")
        assert isinstance(app.screen, ConfirmScreen)
        await pilot.press("y")
        await settle(pilot)
        assert server.call("GET", "/v1/health", "ops")["server"]["draining"] is True
        (srv,) = shown(app, "pool-servers")
        assert srv[1] == "draining"
        assert all(g[3].startswith("draining") for g in shown(app, "pool-gpus"))
        assert f"{alice} stays" in str(app.query_one("#pool-status").render())
        assert any(n.title == "Partly done" for n in app._notifications)
        await pilot.press("d", "y")
        await settle(pilot)
        assert server.call("GET", "/v1/health", "ops")["server"]["draining"] is False
        (srv,) = shown(app, "pool-servers")
        assert srv[1] == "ok"


async def test_without_an_admin_token_the_pool_is_read_only(server):
    server.lease("alice", 1, 0.25)
    app = make_app(server, token=None)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        (srv,) = shown(app, "pool-servers")
        assert srv[1] == "ok" and srv[4] == "1" and "no admin token" in srv[-1]
        assert "token create ops --admin" in srv[-1]  # says how to make one
        assert "read-only" in str(app.query_one("#pool-status").render())
        await pilot.press("x")
        assert not isinstance(app.screen, ConfirmScreen)
        assert any(n.title == "No admin token" for n in app._notifications)


async def test_a_client_token_is_refused_admin_data_with_the_servers_reason(server):
    app = make_app(server, token="alice")
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        (srv,) = shown(app, "pool-servers")
        assert srv[1] == "ok" and "admin" in srv[-1].lower()


def test_pool_client_errors_carry_the_servers_message(server):
    client = ServerClient(server.url, server.tokens["ops"])
    with pytest.raises(PoolClientError) as err:
        client.release("lease-does-not-exist")
    assert err.value.status == 404 and err.value.code == "not_found"
    assert "lease-does-not-exist" in err.value.title or "not found" in err.value.title.lower()
    with pytest.raises(PoolClientError) as err:
        ServerClient(server.url, "gp_wrong").clients()
    assert err.value.status == 401
    assert ServerClient(server.url).health().simulated is True


@pytest.mark.needs("openssl")
def test_tls_server_with_a_private_ca(tmp_path):
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        capture_output=True,
        timeout=60,
        check=True,
    )
    srv = Server(tmp_path / "state", "--tls-cert", str(cert), "--tls-key", str(key))
    try:
        assert srv.url.startswith("https://")
        with pytest.raises(PoolClientError) as err:
            ServerClient(srv.url).health()  # not trusted by the system's CAs
        assert "TLS failed" in err.value.title and "--ca-cert" in err.value.hint
        trusted = ServerClient(srv.url, srv.tokens["ops"], ServerClientOptions(ca_cert=str(cert)))
        assert trusted.health().server.tls is True
        assert len(trusted.gpus().gpus) == 4
    finally:
        srv.stop()


async def test_the_documented_walkthrough_makes_the_admin_token_it_needs(tmp_path):
    """docs/console.md's steps as written: ``token create ops --admin`` into a file on one server,
    ``token import ops --admin`` from that file on the other, then the console started with
    ``--admin-token-file`` shows both servers' GPUs and clients (not "health only")."""
    from tui.cli import build_app, parse_options

    token_file = tmp_path / "admin-token"
    first, second = Server(tmp_path / "a"), Server(tmp_path / "b")
    try:
        with token_file.open("w") as out:
            subprocess.run(_server_cmd("token", "create", "ops", "--admin", "--state-dir", str(first.state)),
                           stdout=out, check=True, timeout=30)  # fmt: skip
        with token_file.open() as given:
            subprocess.run(_server_cmd("token", "import", "ops", "--admin", "--state-dir", str(second.state)),
                           stdin=given, check=True, timeout=30)  # fmt: skip
        options = parse_options(
            ["--server", first.url, second.url, "--admin-token-file", str(token_file), "--view", "pool"],
            env={},
        )
        app = build_app(options)
        async with app.run_test(size=SIZE) as pilot:
            await settle(pilot)
            servers = shown(app, "pool-servers")
            assert [row[1] for row in servers] == ["ok", "ok"]
            assert not any("token" in row[-1] for row in servers), servers
            assert len(shown(app, "pool-gpus")) == 8  # 4 GPUs of each server: the admin view
    finally:
        first.stop()
        second.stop()
