"""The data connection across a real network link (issue 12): the lease's worker in one network
namespace, the program in another, joined by a shaped veth pair (tests/netem_link.py; netem where the
kernel has it, else tbf at the same rate). The `copies` scenario's bytes (10 MiB each way, a generic
cuMemcpy, memsets, an async copy from a buffer overwritten after the call) arrive intact over TLS, as
between two hosts, and in plaintext over loopback addresses routed across the same link; and the worker
refuses plaintext from the link's real address; copies large enough to be striped cross it on the
process's extra connections. Each test runs on a link built by iproute2's commands and on one built
through netlink (pyroute2), the way hosts without iproute2 get theirs. `bench/bench_remote.py --netem`
measures the same path. Needs root; a few seconds.
"""

from __future__ import annotations

import os
import subprocess
import sys

import netem_link
import pytest
import remote_helpers
from remote_helpers import CLIENT, MiB, client_env, needs_cc, parse, profile_rows

from server.workers import WorkerDevice, start_worker

shim_dir = remote_helpers.shim_dir  # fixture

pytestmark = [needs_cc, pytest.mark.needs("netem")]

# Both ways of building the link, each where its tool is (tests/required_tools.py).
BACKENDS = [pytest.param("iproute2", marks=pytest.mark.needs("iproute2")), "netlink"]


@pytest.fixture(scope="module", params=BACKENDS)
def link(request):
    before = os.environ.get("GPUPOOL_NETEM_NETLINK")
    os.environ["GPUPOOL_NETEM_NETLINK"] = "1" if request.param == "netlink" else "0"
    try:
        with netem_link.NetemLink() as made:
            yield made
    finally:
        if before is None:
            os.environ.pop("GPUPOOL_NETEM_NETLINK", None)
        else:
            os.environ["GPUPOOL_NETEM_NETLINK"] = before


@pytest.fixture(scope="module")
def far_worker(link):
    """A host-executor worker on the far side of the link, listening on all its addresses."""
    handle = start_worker("netem-lease", [WorkerDevice(0, "", 64 * MiB)], bind_host="0.0.0.0", env={},
                          executor="host", prefix=link.prefix(link.worker_ns))  # fmt: skip
    yield handle
    handle.stop()


class _At:
    """The worker as a client on the link's other side reaches it."""

    def __init__(self, handle, host: str, port: int | None = None) -> None:
        self.handle, self.host, self.port = handle, host, port

    def answer(self) -> dict:
        return {**self.handle.answer(host=self.host), "port": self.port or self.handle.port}


def run_across(link, env: dict[str, str], scenario: str = "copies") -> tuple[dict[str, str], str]:
    env.pop("GPUPOOL_WORKER_LOCAL", None)  # another namespace: its abstract socket is out of reach anyway
    proc = subprocess.run([*link.prefix(link.client_ns), sys.executable, str(CLIENT), scenario], env=env,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    return parse(proc.stdout), proc.stderr


def assert_copies_arrived(out: dict[str, str], err: str) -> None:
    assert out.get("htod_dtoh") == "True", err
    assert out["dtod"] == "True" and out["generic"] == "True" and out["pinned_copy"] == "True"
    assert out["htod_async_took_bytes"] == "True"
    assert out["memsets"][:46] == "efbeadde" * 4 + "34123412" + "7f7f7f"  # D32 x4, D16 x2, D8 x3
    assert out["still_connected"] == "0"


def test_copies_cross_the_link_encrypted(shim_dir, link, far_worker):
    before = link.qdisc_stats()[link.client_ns]
    env = client_env(shim_dir, _At(far_worker, link.worker_ip), GPUPOOL_SHIM_PROFILE="1")
    out, err = run_across(link, env)
    assert_copies_arrived(out, err)
    after = link.qdisc_stats()[link.client_ns]
    assert _sent_bytes(after) - _sent_bytes(before) > 10 * MiB  # through the shaped link, not around it
    # Round trips: a copy to the device never waits (its bytes ride in its frame), a copy to the host
    # waits exactly once (its bytes ride in the reply), whatever the size.
    rows = profile_rows(err)
    htod, dtoh = rows["cuMemcpyHtoD_v2"], rows["cuMemcpyDtoH_v2"]
    assert htod["calls"] >= 2 and htod["waited"] == 0
    assert dtoh["calls"] >= 3 and dtoh["waited"] == dtoh["calls"]


def test_striped_copies_cross_the_link_on_the_processs_extra_connections(shim_dir, link, far_worker):
    from test_remote_lanes import EXPECTED

    env = client_env(shim_dir, _At(far_worker, link.worker_ip), GPUPOOL_SHIM_PROFILE="1")
    out, err = run_across(link, env, "lanes")
    assert out == EXPECTED, err
    assert "went in pieces across 3 connections" in err


def test_copies_cross_the_link_in_plaintext_between_loopback_addresses(shim_dir, link, far_worker):
    out, err = run_across(link, client_env(shim_dir, _At(far_worker, link.worker_loopback_ip)))
    assert_copies_arrived(out, err)


def test_the_worker_refuses_plaintext_from_the_links_real_address(shim_dir, link, far_worker):
    env = client_env(shim_dir, _At(far_worker, link.worker_ip), GPUPOOL_WORKER_TLS_SHA256="")
    out, err = run_across(link, env, "no_lease")
    assert out == {"init": "800", "count": "800"}  # the shim will not send plaintext off the host
    assert "offers no encryption" in err


def _sent_bytes(stats: str) -> int:
    words = stats.split()
    return int(words[words.index("Sent") + 1])


def test_copies_cross_the_link_with_its_delay_encrypted(shim_dir, link, far_worker):
    """Reached the way a measurement across the link reaches the worker (`NetemLink.reach`: directly
    where netem delays the link, else through the userspace relay that holds each segment the delay),
    the copies scenario's bytes arrive intact over TLS."""
    out, err = run_across(link, client_env(shim_dir, _At(far_worker, *link.reach(far_worker.port))))
    assert_copies_arrived(out, err)


ECHO = """
import socket, sys
listener = socket.create_server(("0.0.0.0", 0))
print(listener.getsockname()[1], flush=True)
conn, _ = listener.accept()
conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
while data := conn.recv(64):
    conn.sendall(data)
"""
PING = """
import socket, sys, time
sock = socket.create_connection((sys.argv[1], int(sys.argv[2])))
sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
rtts = []
for _ in range(20):
    t = time.perf_counter()
    sock.sendall(b"x")
    sock.recv(1)
    rtts.append(time.perf_counter() - t)
print(min(rtts) * 1e3)
"""


def test_a_round_trip_across_the_link_takes_the_delay_each_way():
    """The link's one-way delay is in every round trip a client reaching a server through
    `NetemLink.reach` makes, whether netem or (on a kernel without it) the relay adds it: no ping
    comes back sooner than twice the delay."""
    with netem_link.NetemLink(netem_link.LinkOptions(delay="2ms")) as link:
        echo = link.popen(link.worker_ns, [sys.executable, "-c", ECHO], stdout=subprocess.PIPE, text=True)
        host, port = link.reach(int(echo.stdout.readline()))
        ping = link.run(link.client_ns, [sys.executable, "-c", PING, host, str(port)], capture_output=True,
                        text=True, timeout=30)  # fmt: skip
    assert ping.returncode == 0, ping.stderr
    assert float(ping.stdout) >= 4.0  # ms: 2 ms each way
