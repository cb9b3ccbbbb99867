"""The root of every error the ``server`` package raises for a person (``collector.errors`` tells the tree).

    ServerError
    ├── PoolError          the server's refusals, one per HTTP status (server/_errors.py)
    ├── PoolClientError    the client library's: gpuattach and the console (server/client_errors.py)
    ├── EtcdUnavailable    no etcd member answered (server/_etcd.py)
    ├── EtcdError          etcd refused a request (server/_etcd.py)
    ├── WorkerError        a lease's worker did not start (server/workers.py)
    └── Denied             a pod the Kubernetes admission webhook refuses (server/_admission.py)

The standard library only: the client library imports it.
"""

from __future__ import annotations

from collector.errors import GpupoolError


class ServerError(GpupoolError):
    """Anything the pool's server or its client library reports to a person."""
