"""`gpupool-server lease migrate LEASE --to SERVER` between two real gpupool-servers on loopback (simulated
GPUs; the lease workers run the host executor), a program running under `gpuattach run` through the shim.

The target admits the lease and starts a receiving worker (one-time secret, bounded wait, then it exits and
frees its GPU); the lease's worker pauses the lease and sends its memory, its objects' records and its
processes' state there, commits, and tells each process at its next call to reconnect there; the program
notices a pause. Any failure before the commit leaves the lease running on its source."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys

import psutil
import pytest
from pool_harness import (
    ROOT,
    ServerProc,
    api,
    killed_on_failure,
    server_cmd,
    start_remote_program,
    wait_for,
)

pytestmark = [pytest.mark.timeout(120), pytest.mark.needs("native")]
CLIENT = "tests/remote_client.py"
HOST = {"GPUPOOL_WORKER_EXECUTOR": "host"}


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    base = tmp_path_factory.mktemp("xmove")
    a = ServerProc(base / "a", "2xH100-80GB", env=HOST).start()
    # B's workers give other handle values than A's, as another GPU's driver does: the client's must be mapped
    b = ServerProc(
        base / "b", "2xH100-80GB", env={**HOST, "GPUPOOL_HOST_EXECUTOR_FIRST_HANDLE": "0x900000"}
    ).start()
    yield a, b
    a.stop()
    b.stop()


def admin_of(*servers: ServerProc) -> str:
    """One admin token that every server takes (the source asks the target with the operator's token)."""
    token = servers[0].token("ops", admin=True)
    for other in servers[1:]:
        other.token("ops", admin=True, token=token)
    return token


def migrate(source: ServerProc, *args: str, token: str | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
    if token:
        env["GPUPOOL_TOKEN"] = token
    return subprocess.run([*server_cmd(), "lease", "migrate", *args, "--server", source.url], env=env,
                          capture_output=True, text=True, timeout=90, cwd=ROOT)  # fmt: skip


def refused_and_stays(a: ServerProc, b: ServerProc, lease: dict, admin: str, why: str) -> None:
    """`lease migrate LEASE --to B` fails in one line saying `why`; B keeps no record of the lease and it runs
    on at A."""
    assert why in one_error(migrate(a, lease["id"], "--to", b.url, token=admin))
    assert api(b.url, "GET", f"/v1/leases/{lease['id']}", admin)[0] == 404
    assert api(a.url, "GET", f"/v1/leases/{lease['id']}", admin)[1]["state"] == "active"


def start_program(server: ServerProc, tmp_path, client: str, admin: str, scenario: str = "migrate_server",
                  token: str | None = None) -> tuple[subprocess.Popen, dict]:  # fmt: skip
    """A scenario of tests/remote_client.py under `gpuattach run` on `server` (by default what a move to
    another server carries; `migrate`: every object kind), once it holds its objects; its lease. Copies go
    through the connection and page-locked memory is not shared (shared memory is this host's: a move to another
    server refuses it)."""
    return start_remote_program(server, tmp_path, client, admin, scenario, token=token,
                                env={"GPUPOOL_SHIM_SHARED_COPIES": "0", "GPUPOOL_SHIM_SHARED_PINNED": "0"})  # fmt: skip


def started_for_both(pair, tmp_path, client: str, scenario: str) -> tuple[subprocess.Popen, dict, str]:
    """`scenario` running on A under a client token B takes too (its heartbeats follow the lease there); its lease
    and the admin token both servers take."""
    a, b = pair
    admin = admin_of(a, b)
    token = a.token(client)
    b.token(client, token=token)
    run, lease = start_program(a, tmp_path, client, admin, scenario, token=token)
    return run, lease, admin


def finishes_intact(run: subprocess.Popen, lines: str = "done\n") -> dict[str, str]:
    """The program goes on (after `lines` on its stdin) and finds every address holding its bytes, every handle
    working; what it said."""
    try:
        out, err = run.communicate(lines, timeout=60)
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == 0, out + err
    result = dict(line.split(" ", 1) for line in out.splitlines() if " " in line)
    names = [name.removeprefix("same_") for name in result if name.startswith("same_")]
    assert names and all(result[f"same_{name}"] == "True" for name in names), out
    assert result["finished"] == "1", out
    return result


def fails_and_runs_on(source: ServerProc, target: ServerProc, run, lease: dict, admin: str, why: str) -> None:
    """The move --to `target` fails after the target admitted the lease, saying `why` (exit 2, one line); the
    target's admission ends and frees its GPU; the program runs on at `source` and finishes intact."""
    with killed_on_failure(run):
        assert why in one_error(migrate(source, lease["id"], "--to", target.url, token=admin))
        wait_for(
            lambda: nothing_held(target, admin, lease["id"]), 15, what="the target to free its admission"
        )
        assert api(source.url, "GET", f"/v1/leases/{lease['id']}", admin)[1]["state"] == "active"
    finishes_intact(run)


def one_error(out: subprocess.CompletedProcess) -> str:
    """Exit 2, no traceback, one error line (after the progress line); that line."""
    assert out.returncode == 2, out.stdout + out.stderr
    assert "Traceback" not in out.stderr
    errors = [line for line in out.stderr.splitlines() if line.startswith("gpupool-server: error:")]
    assert len(errors) == 1, out.stderr
    return errors[0]


def nothing_held(server: ServerProc, admin: str, lease_id: str) -> bool:
    """The server holds nothing for the lease: its record there (if any) ended, no GPU memory counted for it."""
    status, lease = api(server.url, "GET", f"/v1/leases/{lease_id}", admin)
    _, gpus = api(server.url, "GET", "/v1/gpus", admin)
    held = [p for g in gpus["gpus"] for p in g["partitions"] if p["lease_id"] == lease_id]
    return (status == 404 or lease["state"] != "active") and not held


def test_a_running_program_moves_to_another_server_and_finishes_there(pair, tmp_path):
    """A running program's lease on A, moved --to B: the command prints the move (exit 0); the lease runs on
    B from then on (active there, its record on A ended naming B); a process the program starts after the
    move reaches A's worker and is sent to B's, where it works; work the program queued after the move
    without waiting for it runs there first; and the program finishes on B with every byte, handle and
    queued result intact (a kernel, a library's kernel, events, memory allocated and freed after the move)."""
    a, b = pair
    admin = admin_of(a, b)
    client = "mover"
    token = a.token(client)
    b.token(client, token=token)  # the client's heartbeats follow the lease to B
    run, lease = start_program(a, tmp_path, client, admin, token=token)
    with killed_on_failure(run):
        moved = migrate(a, lease["id"], "--to", b.url.removeprefix("http://"), token=admin)
        assert moved.returncode == 0, moved.stdout + moved.stderr
        assert "moved to" in moved.stdout
        _, there = api(b.url, "GET", f"/v1/leases/{lease['id']}", admin)
        assert there["state"] == "active", there
        _, here = api(a.url, "GET", f"/v1/leases/{lease['id']}", admin)
        assert here["state"] != "active" and "moved to" in here["reason"], here
        status, told = api(a.url, "POST", f"/v1/leases/{lease['id']}/heartbeat", token, {})
        assert status == 410 and told["moved_to"] == b.url, told  # heartbeats are told where it went
        assert api(b.url, "POST", f"/v1/leases/{lease['id']}/heartbeat", token, {})[0] == 200
        run.stdin.write("child\n")  # a process started now reaches A's worker, which sends it to B's
        run.stdin.flush()
        assert run.stdout.readline().strip() == "child child_bytes 2a2a2a2a"
        run.stdin.write("queue\n")  # sent to A's worker, which carries it to B's
        run.stdin.flush()
        assert run.stdout.readline().startswith("queued")
    result = finishes_intact(run)
    assert result["queued_words"] == "12" and result["counter"] == "17", result  # 7 + 5, then + 5 on B
    assert result["event_query"] == "0" and result["alloc_after"] == "0", result
    assert result["memset_after"] == "09090909", result
    assert result["library_kernel"] == "3", result  # a library's kernel, loaded anew on B
    assert result["callbacks_before"] == result["callbacks_after"] == "True", (
        result
    )  # its callback connection
    # a module global, found again on B (same_global: its bytes), still written and read where it is now
    assert result["global_after"] == "5a" * 8, result
    # gpuattach released the lease where it got it: A passes the release on to B
    wait_for(lambda: nothing_held(b, admin, lease["id"]), 15, what="the lease to end on B with its program")


@contextlib.contextmanager
def moved_and_old_worker_gone(tmp_path, config: str, client: str):
    """Two servers with `config`; a program under `gpuattach run` on A moved to B, then a call of it (it
    reconnects to B's worker), then A's worker gone; (the program, B, the lease, the admin token) for the block,
    the program finishing intact after it."""
    a = ServerProc(tmp_path / "a", "1xH100-80GB", config=config, env=HOST).start()
    b = ServerProc(tmp_path / "b", "1xH100-80GB", config=config, env=HOST).start()
    try:
        admin = admin_of(a, b)
        token = a.token(client)
        b.token(client, token=token)
        run, lease = start_program(a, tmp_path, client, admin, token=token)
        with killed_on_failure(run):
            old_worker = [p for p in psutil.Process(a.proc.pid).children(recursive=True)
                          if lease["id"] in " ".join(p.cmdline())]  # fmt: skip
            assert old_worker, "the lease's worker on A"
            moved = migrate(a, lease["id"], "--to", b.url, token=admin)
            assert moved.returncode == 0, moved.stdout + moved.stderr
            run.stdin.write("sync\n")  # the program's process reconnects to B's worker: A's exits
            run.stdin.flush()
            assert run.stdout.readline().startswith("synced")
            psutil.wait_procs(old_worker, timeout=20)
            assert not any(p.is_running() for p in old_worker), "A's worker still runs"
            yield run, b, lease, admin
        finishes_intact(run)
    finally:
        a.stop()
        b.stop()


def test_a_process_started_after_the_old_worker_exited_finds_the_lease_on_the_new_server(tmp_path):
    """After a move, once the old worker has exited (its processes reconnected to the new one), a process the
    program starts then — with the old worker's address in its environment — still reaches the lease: the
    heartbeats of `gpuattach run` learn where it went and rewrite the run's worker file, which the shim reads
    at each new connection."""
    fast = (
        '[policy]\nlease_ttl = "4s"\nreap_interval = 0.2\n'  # heartbeats every ~1.3 s: none missed under load
    )
    with moved_and_old_worker_gone(tmp_path, fast, "later") as (run, b, lease, admin):
        expires = api(b.url, "GET", f"/v1/leases/{lease['id']}", admin)[1]["expires_at"]
        wait_for(lambda: api(b.url, "GET", f"/v1/leases/{lease['id']}", admin)[1]["expires_at"] != expires, 20,
                 what="gpuattach's heartbeat at B")  # fmt: skip
        run.stdin.write("child_first_env\n")  # its environment names A's worker, which is gone
        run.stdin.flush()
        assert run.stdout.readline().strip() == "child child_bytes 2a2a2a2a"


def moved_each_time_saying(run, lease: dict, admin: str, hops, line: str, answer: str) -> None:
    """The lease moved along `hops` ((source, target) servers, admin API); after each move the program is sent
    `line` and must answer `answer`; then it finishes (exit 0)."""
    with killed_on_failure(run):
        for source, target in hops:
            status, moved = api(source.url, "POST", f"/v1/admin/leases/{lease['id']}/migrate", admin,
                                {"server": target.url}, timeout=60)  # fmt: skip
            assert status == 200, moved
            run.stdin.write(line + "\n")
            run.stdin.flush()
            assert run.stdout.readline().strip() == answer
    run.communicate("done\n", timeout=60)
    assert run.returncode == 0


def test_values_read_back_through_page_locked_memory_after_a_move_are_the_ones_just_written(pair, tmp_path):
    """A program reading back what its stream just wrote (a memset, a copy into page-locked memory behind it, a
    synchronise: how `.item()` reads a loss) moves A -> B -> A -> B: none of its 200 reads after each move finds
    the value the memory held before the memset (each move's old worker closes the callback connection, maybe
    before the program has attached its new one)."""
    a, b = pair
    run, lease, admin = started_for_both(pair, tmp_path, "reader", "migrate_server_reads")
    moved_each_time_saying(run, lease, admin, ((a, b), (b, a), (a, b)), "reads", "stale 0")


def test_memory_a_pool_kept_when_the_lease_moved_is_the_lease_s_again_on_the_new_server(pair, tmp_path):
    """A program whose pool keeps freed memory (70 % of its partition, until its next synchronisation) moves
    A -> B -> A: after each move it synchronises and allocates 90 % of the partition, as it could have without
    moving (the new worker's pools start empty; it must not count the old worker's kept memory for ever)."""
    a, b = pair
    run, lease, admin = started_for_both(pair, tmp_path, "keeper", "migrate_pool_kept")
    moved_each_time_saying(run, lease, admin, ((a, b), (b, a)), "alloc", "alloc 0")


def test_an_encrypted_programs_large_copies_go_to_the_new_worker_after_a_move(pair, tmp_path):
    """A program whose connection is encrypted (as from another host: `GPUPOOL_DATA_ENCRYPTION=always`) copies
    24 MiB each way — in pieces across its copy lanes, extra connections to the worker — before and after its
    lease moves A -> B -> A: each copy after a move comes back byte for byte (the lanes go to the new worker, not
    to the old one, which is gone)."""
    a, b = pair
    admin = admin_of(a, b)
    token = a.token("laner")
    b.token("laner", token=token)
    run, lease = start_remote_program(a, tmp_path, "laner", admin, "migrate_server_reads", token=token,
                                      env={"GPUPOOL_SHIM_SHARED_COPIES": "0", "GPUPOOL_SHIM_SHARED_PINNED": "0",
                                           "GPUPOOL_DATA_ENCRYPTION": "always"})  # fmt: skip
    moved_each_time_saying(run, lease, admin, ((a, b), (b, a)), "big", "big True")
    # the delivery connections (copies into page-locked memory, in pieces) opened again with each new worker:
    # three at the start and three after coming back on A, three on B
    for server, opened in ((a, 6), (b, 3)):
        assert server.log.read_text().count("a delivery connection of its process") == opened, server.log


@pytest.mark.parametrize("to", ["another GPU", "another server"])
def test_graph_nodes_that_write_and_read_a_module_global_follow_it_to_its_new_address(pair, tmp_path, to):
    """A module global that the target finds again at another address, written by a CUDA graph's memset node,
    read by its copy node and given as a parameter to its kernel node (the graph instantiated), moves --to GPU 1
    of its server or --to B: the instantiated graph run there writes, reads and passes the global where it is
    now (not the old address), a graph built after the move does too, so do kernels launched with its address as
    a parameter and a 3D copy naming it, and the copy node's parameters read back name the address the program
    holds."""
    a, b = pair
    run, lease, admin = started_for_both(pair, tmp_path, f"grapher-{to[-3:]}", "migrate_server_graph_global")
    with killed_on_failure(run):
        moved = migrate(a, lease["id"], "--to", b.url if to == "another server" else "1", token=admin)
        assert moved.returncode == 0, moved.stdout + moved.stderr
    out, err = run.communicate("done\n", timeout=60)
    assert run.returncode == 0, out + err
    result = dict(line.split(" ", 1) for line in out.splitlines() if " " in line)
    assert result["graph_global"] == "5a5a5a5b" and result["graph_out"] == "5a5a5a5a", out
    assert result["new_graph_global"] == "3c3c3c3d", out
    assert result["kernel_global"] == "5", out  # 2 + 3: both launches given the global's address reached it
    assert result["copy3d_global"] == "5", out  # a cuMemcpy3D naming the global's address read it where it is
    assert result["copy_params_same"] == "True", out


def test_arrays_textures_and_the_programs_own_virtual_memory_move_to_another_server(pair, tmp_path):
    """A program holding a CUDA array with contents, a mipmapped array with a filled level (in a context of its
    own), a texture object over the array and a surface object over another, cuMemCreate memory mapped with
    patterns (one allocation held and half unmapped, one released and kept by its mapping) and a tensor map over it
    moves --to B (whose worker gives other handle values): on B every byte is the same (the array, the level, each
    mapping, the unmapped half mapped again from its handle), the texture and surface keep the values the program
    holds and each names its own array, a texture made after gets a value of its own, the tensor map is one B's
    worker knows, and the memory is written and read, unmapped and released there."""
    a, b = pair
    run, lease, admin = started_for_both(pair, tmp_path, "arrays", "migrate_server_arrays")
    with killed_on_failure(run):
        moved = migrate(a, lease["id"], "--to", b.url, token=admin)
        assert moved.returncode == 0, moved.stdout + moved.stderr
        assert api(b.url, "GET", f"/v1/leases/{lease['id']}", admin)[1]["state"] == "active"
    result = finishes_intact(run)
    assert result["vm_written"] == "3c" * 4, result
    assert result["texture_after_distinct"] == "True", result
    assert result["tensor_map_again"] == "0", result  # B's worker knows the tensor map the program holds
    wait_for(lambda: nothing_held(b, admin, lease["id"]), 15, what="the lease to end on B with its program")


def test_memory_held_through_another_reference_is_refused_until_let_go(pair, tmp_path):
    """The program's own virtual memory with a second reference (cuMemRetainAllocationHandle) is not carried: the
    move --to B is refused naming it (exit 2, one line) before B is asked, and the program runs on at A; once the
    program lets go of that reference the lease moves, intact."""
    a, b = pair
    run, lease, admin = started_for_both(pair, tmp_path, "retainer", "migrate_server_arrays")
    with killed_on_failure(run):
        for line in ("retain", "let go"):
            run.stdin.write(f"{line}\n")
            run.stdin.flush()
            assert run.stdout.readline().strip() == f"step {line}"
            if line == "retain":
                refused_and_stays(a, b, lease, admin, "another reference")
        assert migrate(a, lease["id"], "--to", b.url, token=admin).returncode == 0
    finishes_intact(run)


def test_a_worker_file_that_has_not_heard_of_the_move_yet_sends_no_process_back(tmp_path):
    """Right after a move, before gpuattach's heartbeats have told it (here: not for ten minutes), the run's worker
    file still names only the old worker. A process started then by the moved program inherits the new worker's
    address (the shim put it in the program's environment) and goes there — not back to the old worker, which
    has exited once the program reconnected."""
    slow = '[policy]\nlease_ttl = "10m"\n'  # no heartbeat during the test: the file stays as it was
    with moved_and_old_worker_gone(tmp_path, slow, "early") as (run, _, _, _):
        run.stdin.write("child\n")  # inherits the environment as the shim left it: B's worker
        run.stdin.flush()
        assert run.stdout.readline().strip() == "child child_bytes 2a2a2a2a"


def test_the_heartbeat_loop_follows_a_lease_that_moved(pair, tmp_path):
    """The heartbeat loop of gpuattach run and the session keeper (server.client.Heartbeater), beating A for a
    lease that moved to B, is told where it went and beats B from then on, without reporting an end."""
    from server.client import Heartbeater, PoolClient
    from server.client_config import ClientConfig, ServerRef

    a, b = pair
    admin = admin_of(a, b)
    token = a.token("follower")
    b.token("follower", token=token)
    run, lease = start_program(a, tmp_path, "follower", admin, token=token)
    with killed_on_failure(run):
        assert migrate(a, lease["id"], "--to", b.url, token=admin).returncode == 0
        ends: list[str] = []
        beats = Heartbeater(PoolClient(ClientConfig(servers=[ServerRef(a.url, token)], token=token)),
                            ServerRef(a.url, token), lease["id"], 0.05, on_end=lambda state, why: ends.append(why))  # fmt: skip
        beats.start()
        try:
            wait_for(lambda: beats.server.url == b.url, 10, what="the loop to beat B")
            before = api(b.url, "GET", f"/v1/leases/{lease['id']}", admin)[1]["expires_at"]
            wait_for(lambda: api(b.url, "GET", f"/v1/leases/{lease['id']}", admin)[1]["expires_at"] != before, 10,
                     what="a heartbeat to renew the lease on B")  # fmt: skip
        finally:
            beats.stop()
        assert ends == []
    finishes_intact(run)


def test_a_program_holding_every_object_kind_moves_to_another_server_intact(pair, tmp_path):
    """The program that holds every kind of object a lease can hold (tests/remote_client.py `migrate`: contexts, a
    module and a library with their function and kernel, a stream, events, a graph and its instantiated graph, a
    pool and its memory, cuMemAlloc memory, its own virtual memory, a CUDA array, a texture object, a mipmapped
    array), moved --to B: every address holds its bytes there and every handle works."""
    a, b = pair
    run, lease, admin = started_for_both(pair, tmp_path, "everything", "migrate")
    with killed_on_failure(run):
        moved = migrate(a, lease["id"], "--to", b.url, token=admin)
        assert moved.returncode == 0, moved.stdout + moved.stderr
    finishes_intact(run)


def test_a_graph_with_a_host_node_is_refused_before_anything_pauses(pair, tmp_path):
    """A program whose graph holds a host node (a function of the program, which the worker calls back through
    its connection): the move --to B is refused naming the host node (exit 2, one line) before B is asked, and
    the program goes on and finishes intact on A (its graphs run as before). (Every other kind a program holds
    moves: test_a_program_holding_every_object_kind_moves_to_another_server_intact.)"""
    scenario, why = "migrate_graphs", "host node"
    a, b = pair
    admin = admin_of(a, b)
    run, lease = start_program(a, tmp_path, f"holder-{scenario}", admin, scenario)
    with killed_on_failure(run):
        refused_and_stays(a, b, lease, admin, why)
    finishes_intact(run)


def test_graphs_and_instantiated_graphs_move_to_another_server_and_run_as_before(pair, tmp_path):
    """A program holding CUDA graphs — one built node by node (memset, kernel, copy, child graph, event record
    and empty nodes, with edges), instantiated twice before the move (the first's kernel node set anew with
    cuGraphExecKernelNodeSetParams, then the graph's own; the second's copy node switched off), and one captured
    from a stream (a memset, a library kernel's and a function's launches, a copy) and destroyed once
    instantiated — moved --to B, and after a call there back --to A (what B built, read there and built again):
    each instantiated graph launched again leaves the same bytes at the same addresses as before the moves
    (the update kept), the graph instantiated anew does what it did before them, and the program's graph,
    node and instantiated-graph handles still answer (the nodes listed, a kernel node's function and launch
    attribute, an event node's event, a node set anew after the moves and run)."""
    a, b = pair
    admin = admin_of(a, b)
    token = a.token("grapher")
    b.token("grapher", token=token)
    run, lease = start_program(a, tmp_path, "grapher", admin, "migrate_graphs_server", token=token)
    with killed_on_failure(run):
        for source, target in ((a, b), (b, a)):
            moved = migrate(source, lease["id"], "--to", target.url, token=admin)
            assert moved.returncode == 0, moved.stdout + moved.stderr
            assert api(target.url, "GET", f"/v1/leases/{lease['id']}", admin)[1]["state"] == "active"
            run.stdin.write("sync\n")  # a call: the program reconnects to the lease's new worker
            run.stdin.flush()
            assert run.stdout.readline().startswith("step")
    result = finishes_intact(run)  # same_first, _second, _captured, _instantiated_anew, _nodes
    assert result["node_function"] == result["node_attribute"] == result["event_node"] == "True", result
    assert result["set_after"] == "09020202", result  # 0x02020202 + 7: the node set anew after the moves ran


def test_a_receiving_worker_that_dies_mid_copy_leaves_the_lease_on_its_source(tmp_path):
    """The target's receiving worker dies (as if killed) once 3 MiB of the lease's 6 MiB have landed over the
    link's four stripes — more than any one stripe carries, so they land at once: the move fails naming the
    broken link (exit 2, one line), the target's admission ends and frees its GPU, and the program runs on at
    its source and finishes intact."""
    a = ServerProc(tmp_path / "a", "2xH100-80GB", env={**HOST, "GPUPOOL_MIGRATE_STRIPES": "4"}).start()
    b = ServerProc(tmp_path / "b", "2xH100-80GB",
                   env={**HOST, "GPUPOOL_TEST_RECEIVER_DIES_AFTER_BYTES": str(3 << 20)}).start()  # fmt: skip
    try:
        admin = admin_of(a, b)
        run, lease = start_program(a, tmp_path, "unlucky", admin)
        fails_and_runs_on(a, b, run, lease, admin, "link")
    finally:
        a.stop()
        b.stop()


def test_the_memory_goes_over_as_many_connections_as_the_source_says_every_byte_intact(tmp_path):
    """A's workers send a lease's memory over the link's one connection (GPUPOOL_MIGRATE_STRIPES=1), B's over
    four (GPUPOOL_MIGRATE_STRIPES=4): a running program moved A -> B and back B -> A (admin API: each move reports the
    connections its memory went over) finds every byte of its allocations — cut between B's stripes on the way
    back — every handle and every queued result intact, and finishes on A."""
    a = ServerProc(tmp_path / "a", "2xH100-80GB", env={**HOST, "GPUPOOL_MIGRATE_STRIPES": "1"}).start()
    b = ServerProc(tmp_path / "b", "2xH100-80GB", env={**HOST, "GPUPOOL_MIGRATE_STRIPES": "4"}).start()
    try:
        run, lease, admin = started_for_both((a, b), tmp_path, "striped", "migrate_server")
        with killed_on_failure(run):
            for source, target, stripes in ((a, b, 1), (b, a, 4)):
                status, moved = api(source.url, "POST", f"/v1/admin/leases/{lease['id']}/migrate", admin,
                                    {"server": target.url}, timeout=60)  # fmt: skip
                assert status == 200, moved
                assert moved["migration"]["stripes"] == stripes and moved["migration"]["bytes"] > 0, moved
                run.stdin.write("sync\n")  # a call: the program reconnects to the lease's new worker
                run.stdin.flush()
                assert run.stdout.readline().startswith("synced")
            run.stdin.write("queue\n")
            run.stdin.flush()
            assert run.stdout.readline().startswith("queued")
        result = finishes_intact(run)
        assert result["queued_words"] == "12" and result["counter"] == "17", result
    finally:
        a.stop()
        b.stop()


def test_a_texture_that_would_get_another_value_on_the_target_fails_the_move_and_the_lease_stays(tmp_path):
    """A target whose driver gives texture and surface objects other values than the program holds (its kernels
    hold them in their parameters): the move fails before it commits, naming the value (exit 2, one line), the
    target's admission ends and frees its GPU, and the program runs on at its source and finishes intact."""
    a = ServerProc(tmp_path / "a", "2xH100-80GB", env=HOST).start()
    c = ServerProc(
        tmp_path / "c", "2xH100-80GB", env={**HOST, "GPUPOOL_HOST_EXECUTOR_FIRST_SAMPLER": "100"}
    ).start()
    try:
        run, lease, admin = started_for_both((a, c), tmp_path, "sampler", "migrate_server_arrays")
        fails_and_runs_on(a, c, run, lease, admin, "another value")
    finally:
        a.stop()
        c.stop()


def test_an_admission_nobody_sends_to_ends_by_itself_and_frees_its_gpu(pair):
    """POST /v1/admin/leases/{id}/receive admits the lease on a GPU of its model (the room counted, the
    receiving worker's port and one-time secret answered); when no sender comes within wait_s the worker
    exits and the record ends, its room free again. A wrong secret on the link is refused."""
    from virtualize.server import _migrate_link

    _, b = pair
    admin = admin_of(b)
    body = {"client": "someone", "source": "elsewhere", "secret": "s" * 32, "ttl_s": 600, "wait_s": 2,
            "partitions": [{"mem_bytes": 1 << 30, "gpu_name": "NVIDIA H100 80GB HBM3", "compute_capability": "9.0"}]}  # fmt: skip
    status, model = api(b.url, "GET", "/v1/gpus", admin)
    body["partitions"][0]["gpu_name"] = model["gpus"][0]["name"]
    body["partitions"][0]["compute_capability"] = model["gpus"][0]["compute_capability"]
    status, receiving = api(b.url, "POST", "/v1/admin/leases/lease-0000feedbeef/receive", admin, body)
    assert status == 200, receiving
    _, lease = api(b.url, "GET", "/v1/leases/lease-0000feedbeef", admin)
    assert lease["state"] == "active" and lease["partitions"][0]["gpu_index"] == receiving["gpus"][0]
    worker = receiving["worker"]
    with pytest.raises(_migrate_link.LinkError):  # a sender without the one-time secret
        _migrate_link.connect(worker["host"], worker["migrate_port"], worker["tls_sha256"], b"wrong", 5)
    assert forged_proof_answer(worker) == {
        "ok": False
    }  # the receiving worker checks the sender's proof itself
    status, again = api(b.url, "POST", "/v1/admin/leases/lease-0000feedbeef/receive", admin, body)
    assert status == 422, again  # one active record per lease id
    wait_for(lambda: nothing_held(b, admin, "lease-0000feedbeef"), 15, what="the unused admission to end")


def forged_proof_answer(worker: dict) -> dict:
    """What the receiving worker answers a sender that ignores its proof and sends a made-up one."""
    import socket
    import ssl

    from virtualize.server import _migrate_link

    sock = socket.create_connection((worker["host"], worker["migrate_port"]), timeout=5)
    if worker["tls_sha256"]:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
        sock = context.wrap_socket(sock)
    with _migrate_link.Link(sock) as link:
        link.send({"hello": "00" * 32})
        link.receive()
        link.send({"proof": "00" * 32})
        return link.receive()


def test_moves_that_cannot_start_are_one_line_errors_and_change_nothing(pair, tmp_path):
    """--to the lease's own server, to a server that is not there, a local lease, a target with no GPU of the
    lease's model free (draining), and an API body naming both a GPU and a server: each is refused with a
    clear error, and the lease stays active where it was."""
    a, b = pair
    admin = admin_of(a, b)
    status, local = api(a.url, "POST", "/v1/leases", a.token("local-two"), {"n": 1, "mem_mib": 256})
    assert status == 201, local
    assert "remote" in one_error(migrate(a, local["id"], "--to", b.url, token=admin))
    run, lease = start_program(a, tmp_path, "stays", admin)
    with killed_on_failure(run):
        assert "this server" in one_error(migrate(a, lease["id"], "--to", a.url, token=admin))
        one_error(migrate(a, lease["id"], "--to", "127.0.0.1:9", token=admin))  # nothing listens there
        status, _ = api(b.url, "POST", "/v1/admin/drain", admin)
        assert status == 200
        try:
            assert "draining" in one_error(migrate(a, lease["id"], "--to", b.url, token=admin))
        finally:
            api(b.url, "DELETE", "/v1/admin/drain", admin)
        status, body = api(
            a.url, "POST", f"/v1/admin/leases/{lease['id']}/migrate", admin, {"to": 1, "server": b.url}
        )
        assert status == 400, body
        assert api(a.url, "GET", f"/v1/leases/{lease['id']}", admin)[1]["state"] == "active"
    finishes_intact(run)


def test_what_cannot_leave_its_host_is_refused_before_the_target_is_asked(pair, tmp_path):
    """A stream capture in flight, then a green context (a partition of this GPU's SMs): each move --to B is
    refused with its reason (exit 2, one line) before B is asked (B has no record of the lease), and the
    program goes on and finishes intact."""
    a, b = pair
    admin = admin_of(a, b)
    run, lease = start_program(a, tmp_path, "rooted", admin, "migrate")
    with killed_on_failure(run):
        run.stdin.write("capture\n")
        run.stdin.flush()
        assert run.stdout.readline().startswith("capturing")
        refused_and_stays(a, b, lease, admin, "capture")
        run.stdin.write("end\n")  # ends the capture
        run.stdin.flush()
        assert run.stdout.readline().startswith("step")
        run.stdin.write("green\n")
        run.stdin.flush()
        assert run.stdout.readline().startswith("step")
        refused_and_stays(a, b, lease, admin, "green contexts")
    finishes_intact(run)


def test_drain_move_moves_a_servers_remote_leases_to_another_and_names_what_stays(tmp_path):
    """`gpupool-server drain A --move --move-to B`: A grants nothing new, its running program's remote lease
    moves to B (said on stderr, printed on stdout) and finishes there, a local lease stays named with its
    reason (exit 1); --move without a server to move to, or with --undo, is one error line."""
    a = ServerProc(tmp_path / "a", "2xH100-80GB", env=HOST).start()
    b = ServerProc(tmp_path / "b", "2xH100-80GB", env=HOST).start()
    try:
        admin = admin_of(a, b)
        token = a.token("drained")
        b.token("drained", token=token)
        run, lease = start_program(a, tmp_path, "drained", admin, token=token)
        with killed_on_failure(run):
            status, local = api(a.url, "POST", "/v1/leases", a.token("local-three"), {"n": 1, "mem_mib": 256})
            assert status == 201, local
            env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")} | {
                "GPUPOOL_TOKEN": admin
            }
            drained = subprocess.run([*server_cmd(), "drain", a.url, "--move", "--move-to", b.url], env=env,
                                     capture_output=True, text=True, timeout=90, cwd=ROOT)  # fmt: skip
            assert drained.returncode == 1, drained.stdout + drained.stderr  # the local lease stays
            assert f"{lease['id']}: moving to" in drained.stderr
            assert f"{lease['id']}: moved to" in drained.stdout and local["id"] in drained.stdout
            assert api(b.url, "GET", f"/v1/leases/{lease['id']}", admin)[1]["state"] == "active"
            assert api(a.url, "GET", "/v1/health")[1]["server"]["draining"] is True
        assert finishes_intact(run)["counter"] == "5"  # the kernel ran on B (nothing queued before)
        for args in (["--move"], ["--move", "--undo"]):
            refused = subprocess.run([*server_cmd(), "drain", a.url, *args], env=env, capture_output=True,
                                     text=True, timeout=30, cwd=ROOT)  # fmt: skip
            one_error(refused)
    finally:
        a.stop()
        b.stop()


@pytest.mark.slow
def test_a_process_that_ends_before_it_reconnects_leaves_nothing_held_on_the_new_worker(pair, tmp_path):
    """A program's lease (taken through the API, no gpuattach run) moved --to B; the program is killed before
    it makes another call: B's worker frees what the program held there (the lease's memory use on B drops to
    0), as when a connection closes, and the lease stays B's."""
    from virtualize.client.remote import fresh_shim, remote_env

    a, b = pair
    admin = admin_of(a, b)
    token = a.token("vanishing")
    b.token("vanishing", token=token)
    status, lease = api(
        a.url, "POST", "/v1/leases", token, {"n": 1, "mem_mib": 256, "remote": True, "ttl_s": 600}
    )
    assert status == 201, lease
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
    env.update(remote_env({"id": lease["id"], "worker": lease["worker"]}, cache_root=tmp_path / "cache",
                          library=fresh_shim(tmp_path / "shim")))  # fmt: skip
    env["GPUPOOL_SHIM_SHARED_COPIES"] = env["GPUPOOL_SHIM_SHARED_PINNED"] = "0"
    run = subprocess.Popen([sys.executable, CLIENT, "migrate_server"], env=env, stdin=subprocess.PIPE,
                           stdout=subprocess.PIPE, text=True, cwd=ROOT)  # fmt: skip
    try:
        assert run.stdout.readline().startswith("ready")
        assert migrate(a, lease["id"], "--to", b.url, token=admin).returncode == 0

        def used() -> int | None:
            return api(b.url, "GET", f"/v1/leases/{lease['id']}", admin)[1]["partitions"][0]["usage"][
                "mem_used_bytes"
            ]

        wait_for(lambda: (used() or 0) > 0, 10, what="the moved memory counted on B")
    finally:
        run.kill()
        run.wait()
    wait_for(lambda: used() == 0, 10, what="B to free what the process held")
    assert api(b.url, "GET", f"/v1/leases/{lease['id']}", admin)[1]["state"] == "active"
