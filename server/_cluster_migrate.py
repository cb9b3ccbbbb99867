"""``gpupool-server cluster migrate``: move one server's embedded store into the cluster's etcd.

What moves: every token (its hash and row: id, client, admin, expiry, revocation), every client's own
limit and idle timeout, the policy overrides, and a record of every live lease (so the cluster-wide
sums count them from the first moment). The sqlite file is only read: the leases and partitions stay
there, where the server keeps managing them in cluster mode.

The lease records are attached to a grace lease of ``GRACE_S``: when the server starts with
``--cluster`` under the member name given here, its first reconcile re-attaches them to its own
membership lease; a server that never comes back gives their share back when the grace ends.
Running it twice is harmless: tokens already in etcd are left as they are, records are re-put.
"""

from __future__ import annotations

import json

from server._cluster import CLIENTS, TOKENS, Cluster
from server._etcd import compare_version, op_put
from server._store import Store

GRACE_S = 3600


def migrate(store: Store, cluster: Cluster, member: str) -> dict:
    lines = []
    report = {"tokens": 0, "clients": 0, "policy": 0, "leases": 0, "grace_h": GRACE_S / 3600}

    for r in store.tokens():
        row = {k: r[k] for k in ("id", "client", "admin", "created", "expires", "revoked")}
        key = TOKENS + r["hash"]
        if cluster._call(cluster.etcd.txn, [compare_version(key, 0)], [op_put(key, json.dumps(row))]):
            report["tokens"] += 1
            lines.append(f"token {r['id']} (client {r['client']}{', admin' if r['admin'] else ''})")
        else:
            lines.append(f"token {r['id']} already in the cluster: left as it is")

    for r in store.client_overrides():
        cluster.set_client(r["name"], {"limit_gpus": r["limit_gpus"], "idle_timeout_s": r["idle_timeout_s"]})
        report["clients"] += 1
        lines.append(f"client {r['name']}: limit {r['limit_gpus']}, idle timeout {r['idle_timeout_s']}")

    overrides = store.policy_overrides()
    if overrides:
        cluster.set_policy(overrides)
        report["policy"] = len(overrides)
        lines.append("policy: " + ", ".join(f"{k}={v}" for k, v in sorted(overrides.items())))

    live = store.live_fractions()
    if live:
        grace = cluster._call(cluster.etcd.lease_grant, GRACE_S)
        for r in live:
            rec = {
                "id": r["id"],
                "client": r["client"],
                "fraction": round(r["fraction"], 6),
                "server": member,
            }
            cluster._call(
                cluster.etcd.txn,
                [],
                [
                    op_put(f"{CLIENTS}{r['client']}/rev", r["id"]),
                    op_put(f"{CLIENTS}{r['client']}/leases/{r['id']}", json.dumps(rec), grace),
                ],
            )
            report["leases"] += 1
            lines.append(f"lease {r['id']} (client {r['client']}, {rec['fraction']:g} GPUs)")
    report["lines"] = lines
    return report
