"""What a session lease needs beside the lease itself, for ``gpuattach request`` and ``gpupool-slurm``:
a keeper process that heartbeats it, and the check that a local lease's server is on this host."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from server.api import Lease, ServerInfo


def on_this_host(info: ServerInfo) -> str | None:
    """--local runs need a server on this very host (the command gets its GPUs directly)."""
    if info.hostname == socket.gethostname() or info.addr.startswith("127.") or info.addr == "::1":
        return None
    return f"--local needs a server on this host; {info.hostname} is another machine"


def start_keeper(
    client, server, lease: Lease, log_dir: Path | None = None, pids_file: Path | None = None
) -> int:
    """A detached process that heartbeats the session lease until it is released or ends; its pid.
    It logs to ``log_dir/keeper-LEASE.log`` (default ~/.cache/gpupool); with ``pids_file`` each beat
    registers the live processes listed there with the lease."""
    from server.client import heartbeat_interval

    if log_dir is None:
        log_dir = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "gpupool"
    log_dir.mkdir(parents=True, exist_ok=True)
    logf = open(log_dir / f"keeper-{lease.id}.log", "ab")  # noqa: SIM115 (handed to the child)
    env = {**os.environ, "GPUPOOL_TOKEN": client.cfg.token_for(server) or ""}  # never on the command line
    if client.cfg.ca_cert:
        env["GPUPOOL_KEEPER_CA_CERT"] = client.cfg.ca_cert
    proc = subprocess.Popen(
        [sys.executable, "-m", "virtualize.client._keeper", "--lease-server", server.url, "--lease-id", lease.id,
         "--interval", str(heartbeat_interval(lease.ttl_s)), "--ttl", str(lease.ttl_s),
         *(["--pids-file", str(pids_file)] if pids_file else [])],
        env=env, stdin=subprocess.DEVNULL, stdout=logf, stderr=logf, start_new_session=True, close_fds=True,
    )  # fmt: skip
    logf.close()
    return proc.pid
