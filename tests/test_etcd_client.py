"""The etcd client against a real 3-member etcd cluster on loopback."""

from __future__ import annotations

import threading
import time

import pytest

from server._etcd import (
    EtcdClient,
    EtcdUnavailable,
    compare_version,
    op_put,
)
from tests.etcd_cluster import EtcdCluster

pytestmark = pytest.mark.needs("etcd")


@pytest.fixture
def cluster(tmp_path):
    c = EtcdCluster(tmp_path)
    c.start()
    yield c
    c.stop()


def test_keys_prefixes_and_transactions(cluster):
    etcd = EtcdClient(cluster.endpoints)
    etcd.put("/gpupool/a/1", b"one")
    etcd.put("/gpupool/a/2", "two")
    etcd.put("/gpupool/b", "other")
    assert etcd.get("/gpupool/a/1").value == b"one"
    assert etcd.get("/missing") is None
    assert [kv.key for kv in etcd.get_prefix("/gpupool/a/")] == ["/gpupool/a/1", "/gpupool/a/2"]

    # Create-if-absent: the second attempt sees version != 0 and changes nothing.
    assert etcd.txn([compare_version("/gpupool/lock", 0)], [op_put("/gpupool/lock", "first")])
    assert not etcd.txn([compare_version("/gpupool/lock", 0)], [op_put("/gpupool/lock", "second")])
    assert etcd.get("/gpupool/lock").value == b"first"
    assert etcd.delete_prefix("/gpupool/a/") == 2


def test_concurrent_create_if_absent_has_one_winner(cluster):
    # Threads talk to different members: etcd's transaction is what keeps them from both winning.
    winners = []

    def claim(i):
        client = EtcdClient(cluster.endpoints[i % 3 :] + cluster.endpoints[: i % 3])
        if client.txn([compare_version("/partition/gpu0", 0)], [op_put("/partition/gpu0", f"lease-{i}")]):
            winners.append(i)

    threads = [threading.Thread(target=claim, args=(i,)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(winners) == 1
    assert EtcdClient(cluster.endpoints).get("/partition/gpu0").value == f"lease-{winners[0]}".encode()


def test_key_under_a_lease_disappears_when_not_renewed(cluster):
    etcd = EtcdClient(cluster.endpoints)
    lease = etcd.lease_grant(1)
    etcd.put("/members/s1", "alive", lease=lease)
    assert etcd.lease_keepalive(lease) >= 1
    assert etcd.get("/members/s1") is not None
    deadline = time.monotonic() + 5
    while etcd.get("/members/s1") is not None:
        assert time.monotonic() < deadline, "leased key outlived its TTL"
        time.sleep(0.2)


def test_minority_loss_is_invisible_majority_loss_is_a_clear_error(cluster):
    etcd = EtcdClient(cluster.endpoints, timeout=2.0)
    etcd.put("/k", "v0")
    first, second, _ = cluster.members

    cluster.kill(first)
    etcd.put("/k", "v1")  # the two others still form a majority
    assert etcd.get("/k").value == b"v1"

    cluster.kill(second)
    with pytest.raises(EtcdUnavailable, match="pool state unavailable: no etcd quorum"):
        etcd.put("/k", "v2")

    cluster.restart(first)
    cluster.restart(second)
    cluster.wait_healthy(cluster.members)
    deadline = time.monotonic() + 10
    while True:
        try:
            etcd.put("/k", "v3")
            break
        except EtcdUnavailable:
            assert time.monotonic() < deadline, "etcd did not recover after quorum returned"
            time.sleep(0.3)
    assert etcd.get("/k").value == b"v3"


def test_bad_endpoint_spec_is_rejected():
    with pytest.raises(ValueError, match="host:port"):
        EtcdClient(["localhost"])
    assert EtcdClient.from_url("etcd://127.0.0.1:1,127.0.0.1:2")._endpoints == [
        ("127.0.0.1", 1),
        ("127.0.0.1", 2),
    ]
