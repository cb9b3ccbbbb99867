"""gpupool-server: one GPU host's share of the pool (see docs/pool.md).

The command is ``server.cli:main``. Inside, one module per job:

- ``_inventory``: the host and its GPUs (NVML through the collector, or a labelled simulated fleet)
- ``_store``: the embedded transactional store (sqlite, WAL): leases, partitions, policy, token hashes
- ``_pool``: the lease logic (fit, grant, heartbeat, release, expiry, idle reclaim, limits, auth)
- ``_filters``, ``_requests``, ``_errors``: request filters, request bodies, the error tree
- ``_app``, ``_serve``: the HTTP/JSON API (``openapi.json``) and start-up/shutdown
- ``_activity``, ``_procs``: is a lease's GPU work happening (NVML per-process, or CPU on simulated)
- ``_mps``: CUDA MPS daemon for partition enforcement; ``_events``: pool_events telemetry
- ``_remote``: the one hook into remote execution (``worker``, ``_cuda``, ``_executor*``)
- ``_cluster``, ``_cluster_migrate``, ``_etcd``: cluster mode — membership, shared tokens/policy and
  cluster-wide limits on etcd (through its JSON gateway), and the move from the embedded store
"""
