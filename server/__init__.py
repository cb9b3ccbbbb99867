"""The pool: one GPU host's share of it (``gpupool-server``) and the client library to use it (docs/pool.md).

Public: ``api`` (the API's requests and answers as msgspec structs: the one declaration of each field,
openapi.json generated from it), ``client`` (``PoolClient`` for gpuattach, ``ServerClient`` for the
console, one transport, one heartbeat loop), ``client_config`` (client.toml), ``errors`` (the package's
error root ``ServerError``), ``client_errors`` (the client's error tree),
``workers`` (starting and stopping a lease's worker process by module name). The command is
``server.cli:main``. Inside, one private module per job:

- ``_inventory``: the host and its GPUs (NVML through the collector, or a labelled simulated fleet)
- ``_store``: the embedded transactional store (sqlite, WAL): leases, partitions, policy, token hashes;
  on a full disk it keeps lease changes in memory until they can be written
- ``_lock``: one server per state directory (an flock on the directory)
- ``_pool``: the lease logic (fit, grant, heartbeat, release, expiry, idle reclaim, limits, auth)
- ``_filters``, ``_errors``: request filters, the error tree of the server's refusals
- ``_app``, ``_serve``: the HTTP/JSON API (``openapi.json``) and start-up/shutdown
- ``_activity``, ``_procs``: is a lease's GPU work happening (NVML per-process, or CPU on simulated)
- ``_mps``: CUDA MPS daemon for partition enforcement; ``_events``: pool_events telemetry
- ``_cluster``, ``_cluster_migrate``, ``_etcd``: cluster mode — membership, shared tokens/policy and
  cluster-wide limits on etcd (through its JSON gateway), and the move from the embedded store
- ``_backoff``: the client's retry delays
- ``_admission``, ``_webhook``: Kubernetes — a pod's ``gpupool.io/gpu`` annotation turned into a JSON
  patch that wraps its command in ``gpuattach run``, and the admission webhook's HTTPS server
  (``gpupool-server webhook``, docs/schedulers.md)
"""
