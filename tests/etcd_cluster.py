"""A real etcd cluster on loopback for tests (Debian's etcd-server package provides `etcd`)."""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path


def free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@dataclass
class Member:
    name: str
    client_port: int
    peer_port: int
    data_dir: Path
    log: Path
    proc: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.client_port}"


@dataclass
class EtcdCluster:
    root: Path
    size: int = 3
    members: list[Member] = field(default_factory=list)

    def __post_init__(self):
        ports = free_ports(2 * self.size)
        for i in range(self.size):
            name = f"m{i}"
            self.members.append(
                Member(name, ports[2 * i], ports[2 * i + 1], self.root / name, self.root / f"{name}.log")
            )

    @property
    def endpoints(self) -> list[str]:
        return [m.endpoint for m in self.members]

    @property
    def url(self) -> str:
        return "etcd://" + ",".join(self.endpoints)

    def _cluster_arg(self) -> str:
        return ",".join(f"{m.name}=http://127.0.0.1:{m.peer_port}" for m in self.members)

    def start_member(self, member: Member, state: str = "new") -> None:
        member.proc = subprocess.Popen(
            [
                shutil.which("etcd") or "etcd",
                "--name", member.name,
                "--data-dir", str(member.data_dir),
                "--listen-client-urls", f"http://127.0.0.1:{member.client_port}",
                "--advertise-client-urls", f"http://127.0.0.1:{member.client_port}",
                "--listen-peer-urls", f"http://127.0.0.1:{member.peer_port}",
                "--initial-advertise-peer-urls", f"http://127.0.0.1:{member.peer_port}",
                "--initial-cluster", self._cluster_arg(),
                "--initial-cluster-state", state,
                "--initial-cluster-token", "gpupool-test",
                # Short timings so elections and failure detection take well under a second.
                "--heartbeat-interval", "50",
                "--election-timeout", "500",
            ],
            stdout=member.log.open("ab"),
            stderr=subprocess.STDOUT,
        )  # fmt: skip

    def start(self, timeout: float = 20.0) -> None:
        for member in self.members:
            self.start_member(member)
        self.wait_healthy(self.members, timeout)

    def wait_healthy(self, members: list[Member], timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        for member in members:
            while True:
                try:
                    with urllib.request.urlopen(f"http://{member.endpoint}/health", timeout=1) as resp:
                        if b'"true"' in resp.read():
                            break
                except OSError:
                    pass
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"etcd member {member.name} not healthy; log: {member.log.read_text()[-2000:]}"
                    )
                time.sleep(0.1)

    def kill(self, member: Member) -> None:
        if member.proc and member.proc.poll() is None:
            member.proc.send_signal(signal.SIGKILL)
            member.proc.wait(5)

    def restart(self, member: Member) -> None:
        self.start_member(member, state="existing")

    def stop(self) -> None:
        for member in self.members:
            self.kill(member)
