"""Control-plane benchmark: request-to-lease and release latency, leases/s, on loopback.

Starts 1 and then 3 real ``gpupool-server`` processes (simulated GPUs: the control plane does the
same work either way) and 200 concurrent clients, each looping: acquire a lease the way ``gpuattach``
does (ask every server at once with /v1/fit, claim on the best, back off when none fits), then
release it. Clients run in several processes (threads within each) so the client side's GIL does
not cap the servers.

    python bench/bench_control_plane.py [--clients 200] [--duration 15] [--servers 1 3]
    python bench/bench_control_plane.py --cluster [--tenants 20]   # cluster mode on a 3-member etcd

``--cluster`` starts a 3-member etcd cluster on loopback (needs the ``etcd`` binary; or give
``--cluster etcd://...`` of a running one) and the servers with ``--cluster``: every grant then also
reads the client's cluster-wide sum and commits one etcd transaction. ``--tenants N`` spreads the
clients over N client names (tokens): grants of one client name serialize on its etcd marker, so
one name for all 200 clients is the worst case of cluster mode.

Prints one Markdown table row per configuration (paste into bench/RESULTS.md).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from server.ranges import MIN_FRACTION  # noqa: E402  (after the path above)


def _client_proc(urls, tokens, threads, start_at, stop_at, out):
    from server.client import LeaseRequest, PoolClient
    from server.client_config import ClientConfig, ServerRef

    lat_lease, lat_release, errors = [], [], []
    lock = threading.Lock()

    def loop(token):
        client = PoolClient(ClientConfig(servers=[ServerRef(u, None) for u in urls], token=token))
        req = LeaseRequest(n=1, fraction=MIN_FRACTION)  # the smallest partition: 8 GPUs hold 512 of them
        while time.time() < start_at:
            time.sleep(0.005)
        while time.time() < stop_at:
            t0 = time.perf_counter()
            try:
                server, lease = client.acquire(req, timeout_s=30)
            except Exception as exc:
                with lock:
                    errors.append(type(exc).__name__ + ": " + str(exc)[:100])
                continue
            t1 = time.perf_counter()
            client.release(server, lease.id)
            t2 = time.perf_counter()
            with lock:
                lat_lease.append(t1 - t0)
                lat_release.append(t2 - t1)
        client.close()

    ts = [threading.Thread(target=loop, args=(tokens[i % len(tokens)],)) for i in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    out.put((lat_lease, lat_release, errors))


def _pct(values, p):
    values = sorted(values)
    return values[min(len(values) - 1, int(p / 100 * len(values)))] if values else float("nan")


def run(n_servers: int, clients: int, duration: float, procs: int, cluster: str | None, tenants: int) -> dict:
    from pool_harness import ServerProc

    tmp = Path(tempfile.mkdtemp(prefix="gpupool-bench-"))
    extra = ("--log-level", "WARNING") + (("--cluster", cluster) if cluster else ())
    # 200 clients under one name would pass the default cap of 32 leases per client: lift it here
    config = "[policy]\nmax_leases_per_client = 10000\n"
    servers = [
        ServerProc(tmp / f"s{i}", "8xH100-80GB", config=config, extra=extra).start() for i in range(n_servers)
    ]
    try:
        names = [f"bench{t}" for t in range(tenants)]
        if cluster:  # issued once, in etcd, valid on every server
            from server._cluster import open_cluster

            c = open_cluster(cluster, "bench")
            tokens = [c.create_token(n)["token"] for n in names]
            time.sleep(3)  # the servers register
        else:
            tokens = [servers[0].token(n) for n in names]
            for s in servers[1:]:  # the same token on every server (gpupool-server token import)
                for n, t in zip(names, tokens, strict=True):
                    s.token(n, token=t)
        q = mp.Queue()
        start_at = time.time() + 2.0
        stop_at = start_at + duration
        per = [clients // procs + (1 if i < clients % procs else 0) for i in range(procs)]
        ps = [
            mp.Process(target=_client_proc, args=([s.url for s in servers], tokens, k, start_at, stop_at, q))
            for k in per
        ]
        for p in ps:
            p.start()
        results = [q.get(timeout=duration + 120) for _ in ps]
        for p in ps:
            p.join(timeout=30)
        lease = [x for r in results for x in r[0]]
        release = [x for r in results for x in r[1]]
        errors = [x for r in results for x in r[2]]
        return {
            "servers": n_servers,
            "clients": clients,
            "leases": len(lease),
            "leases_per_s": len(lease) / duration,
            "lease_p50_ms": _pct(lease, 50) * 1e3,
            "lease_p99_ms": _pct(lease, 99) * 1e3,
            "release_p50_ms": _pct(release, 50) * 1e3,
            "release_p99_ms": _pct(release, 99) * 1e3,
            "errors": len(errors),
            "error_sample": errors[:3],
            "mean_lease_ms": statistics.fmean(lease) * 1e3 if lease else float("nan"),
        }
    finally:
        for s in servers:
            s.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=200)
    ap.add_argument("--duration", type=float, default=15.0, help="seconds of measurement per configuration")
    ap.add_argument("--servers", type=int, nargs="+", default=[1, 3])
    ap.add_argument(
        "--client-procs", type=int, default=4, help="client processes the clients are spread over"
    )
    ap.add_argument(
        "--cluster",
        nargs="?",
        const="start",
        metavar="etcd://H:P,...",
        help="cluster mode: the servers keep their shared state in etcd (alone: start a 3-member etcd here)",
    )
    ap.add_argument("--tenants", type=int, default=1, help="client names the clients are spread over")
    args = ap.parse_args()
    etcd = None
    if args.cluster == "start":
        from etcd_cluster import EtcdCluster

        root = Path(tempfile.mkdtemp(prefix="gpupool-bench-etcd-"))
        etcd = EtcdCluster(root)
        etcd.start()
        args.cluster = etcd.url
    try:
        return _bench(args)
    finally:
        if etcd is not None:
            etcd.stop()


def _bench(args) -> int:
    machine = f"{platform.node()}: {os.cpu_count()} cores, {platform.python_version()}"
    print(
        f"# control plane on loopback ({machine}); {args.clients} concurrent clients, {args.duration:g}s each, "
        f"{args.tenants} client name(s)" + (f", cluster mode on {args.cluster}" if args.cluster else ""),
        flush=True,
    )
    print("| servers | clients | leases/s | request→lease p50 | p99 | release p50 | p99 | errors |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for n in args.servers:
        r = run(n, args.clients, args.duration, args.client_procs, args.cluster, args.tenants)
        print(f"| {r['servers']} | {r['clients']} | {r['leases_per_s']:.0f} | {r['lease_p50_ms']:.1f} ms | {r['lease_p99_ms']:.1f} ms | "
              f"{r['release_p50_ms']:.1f} ms | {r['release_p99_ms']:.1f} ms | {r['errors']} |", flush=True)  # fmt: skip
        if r["errors"]:
            print(f"  errors, e.g.: {r['error_sample']}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
