"""Where a run's lease's worker is now: the file gpuattach keeps and the shim reads at each new connection.

`gpuattach run` writes it when the command starts and again when the lease moves to another gpupool-server
(its heartbeats are told `moved_to`; the new server's answer names the new worker). A process of the run
that starts after the move has the old worker's address in its environment; the shim takes the address from
this file instead (``GPUPOOL_WORKER_FILE``; virtualize/client/shim/shim.c, `lease_location_read`), so it
reaches the lease after the old worker has gone. One ``key value`` per line: ``worker HOST:PORT``,
``local NAME`` (its Unix socket, on its host), ``tls SHA256`` (the certificate the shim pins).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from server.api import Worker


def render(worker: Worker) -> str:
    host = f"[{worker.host}]" if ":" in worker.host and not worker.host.startswith("[") else worker.host
    return f"worker {host}:{worker.port}\nlocal {worker.local or ''}\ntls {worker.tls_sha256 or ''}\n"


def write(path: Path, worker: Worker) -> None:
    """Replace the file at once: a process reads the old location or the new one, never half."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".worker.")
    with os.fdopen(fd, "w") as f:
        f.write(render(worker))
    os.replace(tmp, path)
