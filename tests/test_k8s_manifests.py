"""deploy/kubernetes/*.yaml checked without a cluster: every object against the Kubernetes API's schema
(the official Python client's typed models, strictly: tests/k8s_models.py), and the names the objects
refer to each other by (Secret, ConfigMap, ServiceAccount, Service, ports) against the objects there.

`kubectl apply --dry-run=client` cannot do this here: without an API server it cannot download the
OpenAPI schema it validates against (and `--validate=false` checks nothing).
"""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import k8s_models
import pytest
import yaml

from server._admission import INSTALL_DIR

DEPLOY = Path(__file__).resolve().parent.parent / "deploy" / "kubernetes"
MANIFESTS = sorted(DEPLOY.glob("*.yaml"))


def objects() -> list[dict]:
    return [obj for path in MANIFESTS for obj in yaml.safe_load_all(path.read_text()) if obj]


def by_kind(kind: str) -> dict[str, dict]:
    return {o["metadata"]["name"]: o for o in objects() if o["kind"] == kind}


@pytest.mark.parametrize("path", MANIFESTS, ids=[p.name for p in MANIFESTS])
def test_every_manifest_object_fits_the_kubernetes_api_schema(path):
    """Each object of deploy/kubernetes/ deserializes into its typed API model with no unknown field,
    no value of a wrong type and no required field missing."""
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    assert docs, f"{path.name} holds no object"
    for doc in docs:
        k8s_models.load(doc)


def test_the_schema_check_catches_typos_wrong_types_and_missing_fields():
    """The checker fails a DaemonSet with a misspelt field, a port given as a list, and a container
    without a name — what a typo in a manifest would be (so the test above can fail)."""
    daemonset = by_kind("DaemonSet")["gpupool-server"]
    container = daemonset["spec"]["template"]["spec"]["containers"][0]
    for change in (
        lambda c: c.update(imagePulPolicy="Always"),
        lambda c: c.update(ports=[{"containerPort": [56001]}]),
        lambda c: c.pop("name"),
    ):
        broken = {**container}
        change(broken)
        doc = {**daemonset, "spec": {**daemonset["spec"]}}
        doc["spec"]["template"] = {"metadata": {}, "spec": {"containers": [broken]}}
        with pytest.raises(k8s_models.SchemaError):
            k8s_models.load(doc)


def test_the_manifests_refer_to_objects_they_define():
    """The webhook configuration points at the webhook's Service, path and port; the Service selects
    the webhook's pods and targets a port they open; the pods mount the ConfigMap and Secrets the
    set-up names; every object lives in the gpupool namespace."""
    (namespace,) = by_kind("Namespace")
    for o in objects():
        if o["kind"] not in ("Namespace", "MutatingWebhookConfiguration"):
            assert o["metadata"]["namespace"] == namespace
    service = by_kind("Service")["gpupool-webhook"]
    deployment = by_kind("Deployment")["gpupool-webhook"]
    pod = deployment["spec"]["template"]
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    (hook,) = by_kind("MutatingWebhookConfiguration")["gpupool"]["webhooks"]
    client = hook["clientConfig"]["service"]
    assert (client["name"], client["namespace"]) == ("gpupool-webhook", namespace)
    assert client["port"] in [p["port"] for p in service["spec"]["ports"]]
    (container,) = pod["spec"]["containers"]
    args = container["command"]
    assert args[:2] == ["gpupool-server", "webhook"]
    port = next(p for p in service["spec"]["ports"] if p["port"] == client["port"])["targetPort"]
    opened = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert f"--port={opened[port]}" in args
    assert client["path"] == "/mutate"
    assert pod["spec"]["serviceAccountName"] in by_kind("ServiceAccount")
    assert hook["rules"][0]["resources"] == ["pods"] and hook["rules"][0]["operations"] == ["CREATE"]
    # Pods of the pool's own namespace are never sent to the webhook (it would wait on itself).
    assert (
        by_kind("Namespace")[namespace]["metadata"]["labels"]
        .items()
        .isdisjoint(hook["namespaceSelector"]["matchLabels"].items())
    )
    daemonset = by_kind("DaemonSet")["gpupool-server"]
    volumes = {v["name"]: v for v in daemonset["spec"]["template"]["spec"]["volumes"]}
    assert volumes["config"]["configMap"]["name"] in by_kind("ConfigMap")
    assert "server.toml" in by_kind("ConfigMap")["gpupool-server-config"]["data"]


def test_the_server_config_of_the_configmap_is_one_gpupool_server_accepts(tmp_path):
    """The server.toml the ConfigMap carries loads with gpupool-server's own config reader and every
    value is in range."""
    from server._config import check_ranges, load_config

    text = by_kind("ConfigMap")["gpupool-server-config"]["data"]["server.toml"]
    path = tmp_path / "server.toml"
    path.write_text(text)
    cfg = load_config(path)
    check_ranges(cfg, "server.toml")
    assert cfg.port == 56001


def test_the_image_holds_what_the_webhook_and_the_manifests_run():
    """The Dockerfile installs gpupool where the webhook's init container copies it from (INSTALL_DIR)
    with bin/gpuattach, and puts gpupool-server on PATH for the DaemonSet and the Deployment."""
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    assert f"COPY --from=build {INSTALL_DIR} {INSTALL_DIR}" in dockerfile
    assert f"ENV PATH={INSTALL_DIR}/bin:$PATH" in dockerfile
    assert "gpuattach gpupool-server" in dockerfile
    for o in objects():
        if o["kind"] in ("DaemonSet", "Deployment"):
            for c in o["spec"]["template"]["spec"]["containers"]:
                assert shlex.split(" ".join(c["command"]))[0] == "gpupool-server"


def test_the_daemonsets_token_import_stores_every_client_of_the_secret_and_survives_a_restart(tmp_path):
    """The DaemonSet's init container script, run here with the real gpupool-server: each key of the
    tokens Secret (a file per key, as Kubernetes mounts it) becomes that client's token on the server;
    run again (a pod restart) it keeps them and succeeds; a file that holds no token fails the pod."""
    from pool_harness import BIN, ServerProc, api

    daemonset = by_kind("DaemonSet")["gpupool-server"]
    (init,) = daemonset["spec"]["template"]["spec"]["initContainers"]
    assert init["command"][:2] == ["sh", "-ec"]
    state, tokens = tmp_path / "state", tmp_path / "tokens"
    script = (
        init["command"][2].replace("/var/lib/gpupool", str(state)).replace("/etc/gpupool/tokens", str(tokens))
    )
    tokens.mkdir()
    secret = {"ml-team": "gp_" + "a" * 40, "vision": "gp_" + "b" * 40}
    for client, token in secret.items():
        (tokens / client).write_text(token)  # a Secret volume's file: the value, no newline
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}"}
    for _ in range(2):
        run = subprocess.run(["sh", "-ec", script], env=env, capture_output=True, text=True, timeout=60)
        assert run.returncode == 0, run.stderr
    server = ServerProc(state).start()
    try:
        for token in secret.values():
            status, body = api(server.url, "GET", "/v1/leases", token=token)
            assert status == 200, body
    finally:
        server.stop()
    (tokens / "broken").write_text("not a token")
    run = subprocess.run(["sh", "-ec", script], env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode != 0 and "token" in run.stderr


def test_the_yaml_examples_of_the_docs_fit_the_kubernetes_api_schema():
    """Every ```yaml example of docs/schedulers.md is a Kubernetes object that fits its API schema."""
    text = (DEPLOY.parent.parent / "docs" / "schedulers.md").read_text()
    blocks = [b.split("```", 1)[0] for b in text.split("```yaml\n")[1:]]
    assert blocks
    for block in blocks:
        k8s_models.load(yaml.safe_load(block))
