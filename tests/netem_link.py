"""A real network link between two processes of this host: two network namespaces joined by a veth
pair, shaped by `tc netem` in both directions (rate and one-way delay), for the remote-execution
benchmark and tests. Needs root and `ip` / `tc` (iproute2), or where those are missing pyroute2 and
`nsenter` (tests/netem_netlink.py: the same link through netlink; GPUPOOL_NETEM_NETLINK=1 or 0
picks one); `unavailable()` says why not. On a kernel built without `sch_netem` the link is shaped by
`tbf` instead: the same rate, no added delay in the kernel; a server reached through `reach(port)` is
then reached through a userspace relay in the worker's namespace that holds each segment the link's
delay (tests/delay_relay.py), so latency is still part of the measurement (`NetemLink.shaping` says
which one a link got).

    with NetemLink(LinkOptions(rate="25gbit", delay="20us")) as link:
        link.popen(link.worker_ns, [...])          # e.g. the lease's worker, listening on link.worker_ip
        link.run(link.client_ns, [...])            # the client, reaching it across the link
        host, port = link.reach(worker_port)       # where the client finds it, with the link's delay

The worker's side is `worker_ns` at `worker_ip`, the client's `client_ns` at `client_ip`. Besides the
real addresses the link carries a loopback pair (`worker_loopback_ip` 127.77.0.1 in the worker's
namespace, `client_loopback_ip` 127.77.0.2 in the client's), routed over the same shaped veth
(`route_localnet`): to gpupool both ends look like one host, so the data connection runs unencrypted
across the link, which is how a plaintext copy over the link is measured (gpupool refuses plaintext
between real hosts). Everything is torn down on exit, on failure too: processes started through
`popen` are ended, the namespaces (and with them the veth pair and its qdiscs) deleted.
"""

from __future__ import annotations

import functools
import os
import re
import selectors
import shutil
import socket
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

import netem_netlink

WORKER_IP, CLIENT_IP = "10.77.0.1", "10.77.0.2"
WORKER_LOOPBACK_IP, CLIENT_LOOPBACK_IP = "127.77.0.1", "127.77.0.2"


@dataclass(frozen=True)
class LinkOptions:
    rate: str = "25gbit"  # tc's units: each direction's bandwidth
    delay: str = "20us"  # one way: a round trip is twice this plus the hosts' own time
    mtu: int = 1500  # 9000 is a jumbo-frame data-centre link
    # netem's queue, in packets (GSO packets of up to 64 KiB on veth). The default 1000 is plenty for
    # 25 Gbit/s x 20 µs (62.5 KB in flight); raised so a sender's burst queues instead of dropping.
    limit: int = 10000
    # tbf (no netem): the bucket, bytes at full rate (> rate / HZ, or the shaper cannot reach the rate;
    # a GSO packet larger than it is split), and the queue, bytes
    tbf_burst: int = 4 << 20
    tbf_limit: int = 64 << 20

    def netem(self) -> list[str]:
        return ["netem", "rate", self.rate, "delay", self.delay, "limit", str(self.limit)]

    def tbf(self) -> list[str]:
        return ["tbf", "rate", self.rate, "burst", str(self.tbf_burst), "limit", str(self.tbf_limit)]

    def delay_ns(self) -> int:
        """The one-way delay in nanoseconds (tc's units: 20us, 1ms, 0.5s, 100ns)."""
        found = re.fullmatch(r"([0-9.]+)\s*(ns|us|usec|ms|msec|s|sec)?", self.delay.strip())
        if not found:
            raise ValueError(f"not a delay in tc's units: {self.delay!r} (e.g. 20us, 1ms)")
        scale = {"ns": 1, "us": 1e3, "usec": 1e3, "ms": 1e6, "msec": 1e6, "s": 1e9, "sec": 1e9}
        return int(float(found[1]) * scale[found[2] or "us"])  # tc reads a bare number as µs


def netlink() -> bool:
    """Whether the link is built through netlink (pyroute2) rather than iproute2's commands."""
    wanted = os.environ.get("GPUPOOL_NETEM_NETLINK")
    if wanted in ("0", "1"):
        return wanted == "1"
    return shutil.which("ip") is None or shutil.which("tc") is None


def unavailable() -> str | None:
    """Why a link cannot be made here (None: it can)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if netlink():
        why = netem_netlink.available()
        if why is None and not (has_qdisc("netem") or has_qdisc("tbf")):
            return "neither the netem nor the tbf qdisc is in this kernel"
        return why
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"no `{tool}` (iproute2)"
    probe = f"gpnetem-probe-{uuid.uuid4().hex[:8]}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"`ip netns add` failed: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    if not (has_qdisc("netem") or has_qdisc("tbf")):
        return "neither the netem nor the tbf qdisc is in this kernel"
    return None


@functools.cache
def has_qdisc(kind: str) -> bool:
    """Whether this kernel has the qdisc `kind` (tried on lo of a throw-away namespace)."""
    if netlink():
        return netem_netlink.has_qdisc(kind)
    probe = f"gpnetem-probe-{uuid.uuid4().hex[:8]}"
    if subprocess.run(["ip", "netns", "add", probe], capture_output=True).returncode != 0:
        return False
    try:
        args = {"netem": ["delay", "1us"], "tbf": ["rate", "1gbit", "burst", "64k", "limit", "64k"]}[kind]
        cmd = ["ip", "netns", "exec", probe, "tc", "qdisc", "add", "dev", "lo", "root", kind, *args]
        return subprocess.run(cmd, capture_output=True).returncode == 0
    finally:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True)


class NetemLink:
    """Two namespaces and a shaped veth pair between them; a context manager that always cleans up."""

    def __init__(self, options: LinkOptions | None = None) -> None:
        self.options = options or LinkOptions()
        tag = uuid.uuid4().hex[:6]
        self.worker_ns, self.client_ns = f"gpnetem-{tag}-w", f"gpnetem-{tag}-c"
        self._veth = (f"gpw{tag}", f"gpc{tag}")  # interface names: at most 15 characters
        self.worker_ip, self.client_ip = WORKER_IP, CLIENT_IP
        self.worker_loopback_ip, self.client_loopback_ip = WORKER_LOOPBACK_IP, CLIENT_LOOPBACK_IP
        o = self.options
        self.shaper = o.netem() if has_qdisc("netem") else o.tbf()
        self.delays = self.shaper[0] == "netem"  # the kernel adds the delay (else: reach()'s relay)
        self.shaping = (
            f"netem rate {o.rate}, delay {o.delay} each way"
            if self.delays
            else f"tbf rate {o.rate} (this kernel has no sch_netem), delay {o.delay} each way by a "
            "userspace relay for servers reached through it"
        ) + f", MTU {o.mtu}, both directions"
        self._procs: list[subprocess.Popen] = []
        self._made: list[str] = []

    # ---- set-up and teardown ----------------------------------------------------------------------

    def __enter__(self) -> NetemLink:
        try:
            self._create()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _create(self) -> None:
        o = self.options
        vw, vc = self._veth
        if netlink():
            for ns in (self.worker_ns, self.client_ns):
                netem_netlink.add_namespace(ns)
                self._made.append(ns)
            netem_netlink.build(self)
            return
        for ns in (self.worker_ns, self.client_ns):
            _ip("netns", "add", ns)
            self._made.append(ns)
            self.sh(ns, "ip", "link", "set", "lo", "up")
        _ip(
            "link",
            "add",
            vw,
            "netns",
            self.worker_ns,
            "type",
            "veth",
            "peer",
            "name",
            vc,
            "netns",
            self.client_ns,
        )
        sides = (
            (self.worker_ns, vw, self.worker_ip, self.worker_loopback_ip, self.client_loopback_ip),
            (self.client_ns, vc, self.client_ip, self.client_loopback_ip, self.worker_loopback_ip),
        )
        macs = {}
        for ns, dev, ip, _, _ in sides:
            self.sh(ns, "ip", "link", "set", dev, "mtu", str(o.mtu), "up")
            self.sh(ns, "ip", "addr", "add", f"{ip}/30", "dev", dev)
            macs[ns] = self.sh(ns, "cat", f"/sys/class/net/{dev}/address").strip()
            self.sh(ns, "tc", "qdisc", "add", "dev", dev, "root", *self.shaper)
        for ns, dev, _, mine, theirs in sides:
            # The loopback pair: this side's own 127.77.0.x, the other's routed over the veth. Only
            # 127.0.0.1 stays on lo (the kernel's 127.0.0.0/8 route would swallow the peer's address).
            peer_ns = self.client_ns if ns == self.worker_ns else self.worker_ns
            for conf in ("all", dev, "lo"):
                self.sh(ns, "sysctl", "-qw", f"net.ipv4.conf.{conf}.route_localnet=1")
                self.sh(ns, "sysctl", "-qw", f"net.ipv4.conf.{conf}.rp_filter=0")
            self.sh(ns, "ip", "route", "del", "local", "127.0.0.0/8", "dev", "lo", "table", "local")
            self.sh(ns, "ip", "route", "replace", "local", "127.0.0.1", "dev", "lo", "table", "local")
            self.sh(ns, "ip", "addr", "add", f"{mine}/32", "dev", dev)
            self.sh(ns, "ip", "route", "add", f"{theirs}/32", "dev", dev, "src", mine)
            self.sh(
                ns, "ip", "neigh", "replace", theirs, "lladdr", macs[peer_ns], "dev", dev, "nud", "permanent"
            )

    def close(self) -> None:
        for proc in reversed(self._procs):
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(5)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(5)
        self._procs.clear()
        for ns in reversed(self._made):  # the veth pair and its qdiscs go with the namespace
            if netlink():
                netem_netlink.delete_namespace(ns)
            else:
                subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        self._made.clear()

    # ---- running things on either side -------------------------------------------------------------

    @staticmethod
    def prefix(ns: str) -> list[str]:
        """The command prefix that runs a program inside namespace `ns`."""
        return netem_netlink.prefix(ns) if netlink() else ["ip", "netns", "exec", ns]

    def sh(self, ns: str, *cmd: str) -> str:
        return _run([*self.prefix(ns), *cmd])

    def popen(self, ns: str, cmd: list[str], **kwargs) -> subprocess.Popen:
        """Start a process in `ns`; it is ended when the link closes."""
        proc = subprocess.Popen([*self.prefix(ns), *cmd], **kwargs)
        self._procs.append(proc)
        return proc

    def run(self, ns: str, cmd: list[str], **kwargs) -> subprocess.CompletedProcess:
        return subprocess.run([*self.prefix(ns), *cmd], **kwargs)

    def reach(self, port: int, timeout: float = 10, host: str | None = None) -> tuple[str, int]:
        """Where a client in `client_ns` reaches a server listening on `port` (any address) in
        `worker_ns` at `host` (default `worker_ip`; `worker_loopback_ip` for a plaintext run), with the
        link's delay: the server itself where netem delays the link, else a relay in the worker's
        namespace at `host` holding each segment the delay each way (tests/delay_relay.py; ended with
        the link)."""
        host = host or self.worker_ip
        if self.delays:
            return host, port
        relay_py = str(Path(__file__).with_name("delay_relay.py"))
        cmd = [sys.executable, relay_py, host, "127.0.0.1", str(port), str(self.options.delay_ns())]
        relay = self.popen(self.worker_ns, cmd, stdout=subprocess.PIPE, text=True)
        with selectors.DefaultSelector() as waiting:  # poll: a test process's descriptors pass 1024
            waiting.register(relay.stdout, selectors.EVENT_READ)
            line = relay.stdout.readline().strip() if waiting.select(timeout) else ""
        if not line.isdigit():
            raise RuntimeError(f"the delay relay did not start within {timeout:.0f} s (exit {relay.poll()})")
        return host, int(line)

    def qdisc_stats(self) -> dict[str, str]:
        """Each side's qdisc statistics (bytes and packets sent, drops, overlimits), as tc prints them."""
        if netlink():
            return {
                ns: netem_netlink.qdisc_stats(ns, dev)
                for ns, dev in zip((self.worker_ns, self.client_ns), self._veth, strict=True)
            }
        return {
            ns: " ".join(self.sh(ns, "tc", "-s", "qdisc", "show", "dev", dev).split())
            for ns, dev in zip((self.worker_ns, self.client_ns), self._veth, strict=True)
        }


def _ip(*args: str) -> str:
    return _run(["ip", *args])


def _run(cmd: list[str]) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {proc.stderr.strip() or proc.returncode}")
    return proc.stdout


# ---- raw capacity: the link measured with plain sockets, the yardstick for "% of the link" ----------

RAW_CHUNK = 4 << 20
RAW_WARMUP = 256 << 20


def raw_transfer(
    link: NetemLink, nbytes: int, *, to_worker: bool, tls: bool = False, loopback: bool = False
) -> float:
    """Bytes per second that one Python TCP stream moves across the link: `nbytes` from one side to the
    other (client to worker when `to_worker`, as a copy to the device), each side a plain loop of
    `sendall` / `recv_into` over 4 MiB buffers, optionally inside TLS 1.3 (AES-GCM, through the
    worker's `_data_tls.TlsStream`, whose large socket reads and writes are the fastest TLS stream
    Python has here). After a 256 MiB warm-up on the same connection, timed by the sender from its
    first byte to the receiver's acknowledgement."""
    import json
    import sys

    if to_worker:
        recv_ns, send_ns = link.worker_ns, link.client_ns
        host = link.worker_loopback_ip if loopback else link.worker_ip
    else:
        recv_ns, send_ns = link.client_ns, link.worker_ns
        host = link.client_loopback_ip if loopback else link.client_ip
    me = [sys.executable, __file__]
    flag = ["--tls"] if tls else []
    receiver = link.popen(recv_ns, [*me, "recv", host, *flag], stdout=subprocess.PIPE, text=True)
    port = receiver.stdout.readline().strip()
    if not port:
        raise RuntimeError("the raw receiver did not start")
    sender = link.run(
        send_ns, [*me, "send", host, port, str(nbytes), *flag], capture_output=True, text=True, timeout=300
    )
    if sender.returncode != 0:
        raise RuntimeError(f"raw sender failed: {sender.stderr[-2000:]}")
    receiver.wait(30)
    return json.loads(sender.stdout)["bytes_per_s"]


def _raw_main(argv: list[str]) -> None:
    import json
    import ssl
    import tempfile
    import time
    from pathlib import Path

    mode, host = argv[0], argv[1]
    tls = "--tls" in argv
    buf = bytearray(RAW_CHUNK)
    view = memoryview(buf)
    if mode == "recv":
        listener = socket.create_server((host, 0))
        print(listener.getsockname()[1], flush=True)
        if tls:
            from virtualize.server import _data_tls

            context, _ = _data_tls.server_context(Path(tempfile.mkdtemp(prefix="gpnetem-raw-")), "raw")
        conn, _ = listener.accept()
        if tls:
            conn = _data_tls.TlsStream(conn, context, server_side=True)
            conn.do_handshake()
        warm, total = int.from_bytes(_exact(conn, 8), "little"), int.from_bytes(_exact(conn, 8), "little")
        _receive(conn, view, warm, tls)
        conn.sendall(b"w")
        _receive(conn, view, total, tls)
        conn.sendall(b"k")
        return
    port, nbytes = int(argv[2]), int(argv[3])
    conn = socket.create_connection((host, port))
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if tls:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.minimum_version = ssl.TLSVersion.TLSv1_3
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
        from virtualize.server import _data_tls

        conn = _data_tls.TlsStream(conn, context, server_side=False)
        conn.do_handshake()
    # A warm-up first, as long-lived as a program's connection: TCP's buffers grow, the stream settles.
    conn.sendall(RAW_WARMUP.to_bytes(8, "little") + nbytes.to_bytes(8, "little"))
    _send(conn, view, RAW_WARMUP)
    if _exact(conn, 1) != b"w":
        raise SystemExit("no acknowledgement")
    start = time.perf_counter()
    _send(conn, view, nbytes)
    if _exact(conn, 1) != b"k":
        raise SystemExit("no acknowledgement")
    print(json.dumps({"bytes_per_s": nbytes / (time.perf_counter() - start)}))


def _send(conn, view: memoryview, nbytes: int) -> None:
    left = nbytes
    while left:
        n = min(left, RAW_CHUNK)
        conn.sendall(view[:n])
        left -= n


def _receive(conn, view: memoryview, nbytes: int, tls: bool) -> None:
    left = nbytes
    while left:  # as the worker receives a copy: a chunk per call
        n = min(left, RAW_CHUNK)
        if tls:
            if not conn.recv_into_all(view[:n]):
                raise SystemExit("the sender went away")
            got = n
        else:
            got = conn.recv_into(view[:n], 0, socket.MSG_WAITALL)
        if not got:
            raise SystemExit("the sender went away")
        left -= got


def _exact(conn, n: int) -> bytes:
    data = bytearray(n)
    view, got = memoryview(data), 0
    while got < n:
        step = conn.recv_into(view[got:])
        if not step:
            raise SystemExit("connection closed")
        got += step
    return bytes(data)


if __name__ == "__main__":  # the two ends of raw_transfer, each in its namespace
    import sys

    sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1]))
    _raw_main(sys.argv[1:])
