"""Copies into a client's page-locked memory through the worker's delivery thread (virtualize/server/_deliveries.py)
end to end, without a GPU: the host executor takes each copy's bytes at its call and, with
GPUPOOL_HOST_EXECUTOR_COPIES=later, leaves them to the delivery thread as a GPU's copies are (by default it
sends them before the call returns). The program must see the same bytes at the same moments either way."""

from __future__ import annotations

import pytest
import remote_helpers
from remote_helpers import client_env, run_client

from server.workers import WorkerDevice, start_worker

shim_dir = remote_helpers.shim_dir  # fixture
worker = remote_helpers.worker  # fixture
MiB = 1 << 20


@pytest.fixture(scope="module")
def later_worker():
    handle = start_worker(
        "test-lease", [WorkerDevice(0, "", 64 * MiB)], bind_host="127.0.0.1",
        env={"GPUPOOL_HOST_EXECUTOR_COPIES": "later"}, executor="host",
    )  # fmt: skip
    yield handle
    handle.stop()


def across_hosts(env: dict[str, str], encryption: str) -> dict[str, str]:
    """The client as one on another host gets it: TCP (not the worker's local socket), TLS on or off."""
    env.pop("GPUPOOL_WORKER_LOCAL", None)
    return {**env, "GPUPOOL_DATA_ENCRYPTION": encryption}


@pytest.mark.parametrize("encryption", ["never", "always"])
@pytest.mark.parametrize("scenario", ["async_copies", "async_copy_ordering"])
def test_copies_sent_by_the_delivery_thread_land_when_their_events_complete(
    shim_dir, worker, later_worker, scenario, encryption
):
    """Copies on four streams chained by events and host functions, 3 MiB ones in pieces across the delivery
    connections (TLS), copies back of copied memory: none lands before its event completes, each is there
    once anything shows it done — the same outcome as when each copy's bytes go before its call returns."""
    at_once, _ = run_client(scenario, across_hosts(client_env(shim_dir, worker), encryption))
    later, _ = run_client(scenario, across_hosts(client_env(shim_dir, later_worker), encryption))
    assert later == at_once
    assert not any("False" in v for v in later.values())  # and every check of the scenario holds
