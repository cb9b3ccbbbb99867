"""Where a run's lease's worker has been: the file gpuattach keeps and the shim reads at each new connection.

`gpuattach run` writes it when the command starts and again when the lease moves to another gpupool-server
(its heartbeats are told `moved_to`; the new server's answer names the new worker), each worker the lease has
had in order, the one it has now last. A process of the run that starts after the move has the old worker's
address in its environment; the shim, finding that address before the last in this file, takes the last one
instead (``GPUPOOL_WORKER_FILE``; virtualize/client/shim/shim.c, `lease_location_read`), so it reaches the lease
after the old worker has gone — and never goes back from a worker the file does not list yet. One ``key value``
per line, a block per worker: ``worker HOST:PORT``, ``local NAME`` (its Unix socket, on its host), ``tls SHA256``
(the certificate the shim pins).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from server.api import Worker


def render(workers: list[Worker]) -> str:
    blocks = []
    for worker in workers:
        host = f"[{worker.host}]" if ":" in worker.host and not worker.host.startswith("[") else worker.host
        blocks.append(
            f"worker {host}:{worker.port}\nlocal {worker.local or ''}\ntls {worker.tls_sha256 or ''}\n"
        )
    return "".join(blocks)


def write(path: Path, workers: list[Worker]) -> None:
    """Replace the file at once: a process reads the old list or the new one, never half."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".worker.")
    with os.fdopen(fd, "w") as f:
        f.write(render(workers))
    os.replace(tmp, path)
