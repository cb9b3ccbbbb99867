"""The pool's HTTP API under Schemathesis: requests generated from the server's own /openapi.json.

A real gpupool-server (simulated GPUs) is called with a client token and with the admin token; for
every documented operation, with bounded examples (25 each, the same on every run — `derandomize`, so CI
is repeatable; raise max_examples and drop derandomize locally to search further): no server error, every status code and
response documented and matching its schema, schema-violating requests refused, the server still up
and its log free of tracebacks at the end. The schemas in openapi.json are derived from
server/api.py (`python -m server.api`); a test here checks the copy is current.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from pool_harness import ServerProc, api
from schemathesis.checks import positive_data_acceptance

ROOT = Path(__file__).resolve().parents[1]
schema = schemathesis.openapi.from_path(ROOT / "server" / "openapi.json")

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = ServerProc(tmp_path_factory.mktemp("fuzz"), "4xH100-80GB").start()
    srv.tokens = {"client": srv.token("fuzzer"), "admin": srv.token("fuzz-admin", admin=True)}
    yield srv
    srv.stop()
    log = srv.log.read_text()
    assert "Traceback" not in log, log[-3000:]


@pytest.fixture(params=["client", "admin"])
def who(request) -> str:
    return request.param


@schema.parametrize()
@settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
def test_every_operation_answers_as_documented(case, server, who):
    token = server.tokens[who]
    # Every check but one: a request the schema allows may still be refused with a documented 400 by a
    # rule across fields ("give exactly one of fraction or mem_mib"), or for a float where msgspec wants
    # an integer (224.0); a schema-violating one must still be refused.
    case.call_and_validate(
        base_url=server.url,
        headers={"Authorization": f"Bearer {token}"},
        excluded_checks=[positive_data_acceptance],
        timeout=10,
    )


def test_the_server_is_up_after_the_fuzzing(server):
    status, body = api(server.url, "GET", "/v1/health")
    assert status == 200, body


def test_the_documented_schemas_are_the_structs_the_server_and_client_use():
    """openapi.json's schemas are exactly those of server/api.py's request and answer structs (the ones
    the server decodes and encodes with and the client reads answers with): a field added to a struct
    without regenerating the document fails here."""
    import json

    from server.api import OPENAPI, openapi_schemas

    documented = json.loads(OPENAPI.read_text())["components"]["schemas"]
    generated = openapi_schemas()
    assert sorted(documented) == sorted(generated), "run python -m server.api"
    for name, schema_of_struct in generated.items():
        assert documented[name] == schema_of_struct, f"{name} is stale: run python -m server.api"


def test_an_older_client_reads_a_newer_servers_lease_answer():
    """A lease answer with fields the client does not know, at every level (the lease, its server, a
    partition, its usage, its job), decodes as api.Lease with the known fields intact: a server that
    adds a field never breaks the gpuattach already installed."""
    import json

    from server.api import Lease, read

    newer = {
        "id": "L1", "client": "alice", "state": "active", "created_at": "2026-01-01T00:00:00Z",
        "expires_at": "2026-01-01T00:01:00Z", "ttl_s": 60.0, "simulated": True, "added": 1,
        "server": {"hostname": "gpu1", "addr": "10.0.0.1", "port": 56001, "version": "9", "simulated": True,
                   "mps": False, "gpu_count": 8, "added": [1]},
        "partitions": [{"gpu_index": 3, "gpu_uuid": "GPU-x", "gpu_name": "H100", "mem_bytes": 5, "fraction": 0.5,
                        "added": {}, "usage": {"mem_used_bytes": 4, "added": 0.5}}],
        "job": {"scheduler": "slurm", "id": "42", "account": "physics", "added": "x"},
    }  # fmt: skip
    lease = read(json.dumps(newer).encode(), Lease)
    assert (lease.id, lease.server.hostname, lease.partitions[0].gpu_index) == ("L1", "gpu1", 3)
    assert lease.partitions[0].usage.mem_used_bytes == 4
    assert lease.job is not None and (lease.job.id, lease.job.account) == ("42", "physics")
