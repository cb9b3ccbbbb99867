"""The Kubernetes admission webhook (`gpupool-server webhook`), without a cluster: a real webhook process
serving HTTPS with the certificate deploy/kubernetes/webhook-cert.sh makes, answering AdmissionReview v1
requests shaped as the Kubernetes reference documents them (tests/fixtures/k8s/README.md). Each JSON
patch is applied with a JSON-Patch implementation (jsonpatch, RFC 6902) and the resulting pod checked,
including against the API's Pod schema (tests/k8s_models.py).
"""

from __future__ import annotations

import base64
import copy
import json
import os
import select
import shutil
import signal
import ssl
import subprocess
import time
import urllib.request
from pathlib import Path

import jsonpatch
import k8s_models
import pytest
from pool_harness import ROOT, ServerProc, api, gpuattach_cmd, server_cmd

FIXTURES = Path(__file__).parent / "fixtures" / "k8s"
IMAGE = "registry.example.org/gpupool:0.1.0"
SERVICE = "gpupool-webhook.gpupool.svc"  # the name the API server checks the certificate against


def fixture(name: str) -> dict:
    return json.loads((FIXTURES / name).read_text())


class Webhook:
    def __init__(self, tmp: Path, *extra: str):
        subprocess.run([str(ROOT / "deploy/kubernetes/webhook-cert.sh"), str(tmp)], check=True,
                       capture_output=True, timeout=60)  # fmt: skip
        self.ca = tmp / "ca.crt"
        self.proc = subprocess.Popen(
            [*server_cmd(), "webhook", "--host", "127.0.0.1", "--port", "0", "--image", IMAGE,
             "--tls-cert", str(tmp / "tls.crt"), "--tls-key", str(tmp / "tls.key"), *extra],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT,
        )  # fmt: skip
        ready, _, _ = select.select([self.proc.stdout], [], [], 20)
        line = self.proc.stdout.readline().decode() if ready else ""
        if "listening on" not in line:
            self.proc.kill()
            raise RuntimeError(f"webhook did not start: {line!r} {self.proc.stderr.read()[-2000:]!r}")
        self.port = int(line.split("https://127.0.0.1:")[1].split("/")[0])

    def post(self, body: bytes | dict) -> tuple[int, dict]:
        """POST /mutate over HTTPS, checking the certificate as the API server does (CA + service name)."""
        ctx = ssl.create_default_context(cafile=str(self.ca))
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        conn = urllib.request.Request(
            f"https://127.0.0.1:{self.port}/mutate", data=data, headers={"Content-Type": "application/json"}
        )
        # The certificate names the Service, not 127.0.0.1: connect by address, verify by name.
        handler = urllib.request.HTTPSHandler(context=_named(ctx, SERVICE))
        with urllib.request.build_opener(handler).open(conn, timeout=10) as resp:
            return resp.status, json.loads(resp.read())

    def stop(self) -> str:
        self.proc.send_signal(signal.SIGTERM)
        _, err = self.proc.communicate(timeout=10)
        return err.decode()


def _named(ctx: ssl.SSLContext, name: str) -> ssl.SSLContext:
    wrap = ctx.wrap_socket

    def wrap_socket(sock, *args, server_hostname=None, **kwargs):
        return wrap(sock, *args, server_hostname=name, **kwargs)

    ctx.wrap_socket = wrap_socket
    return ctx


@pytest.fixture(scope="module")
def webhook(tmp_path_factory):
    hook = Webhook(tmp_path_factory.mktemp("webhook"), "--pool-server", "gpu1.example.org:56001")
    yield hook
    hook.stop()


def admit(webhook: Webhook, review: dict) -> tuple[dict, dict]:
    """(the review's response, the pod after its patch)."""
    status, answer = webhook.post(review)
    assert status == 200 and answer["apiVersion"] == "admission.k8s.io/v1"
    assert answer["kind"] == "AdmissionReview"
    response = answer["response"]
    assert response["uid"] == review["request"]["uid"]
    pod = copy.deepcopy(review["request"]["object"])
    if "patch" in response:
        assert response["patchType"] == "JSONPatch"
        patch = json.loads(base64.b64decode(response["patch"]))
        pod = jsonpatch.apply_patch(pod, patch)
    return response, pod


def test_a_pod_asking_for_half_a_gpu_gets_the_shim_volume_and_a_lease_wrapper(webhook):
    """gpupool.io/gpu "0.5": an init container copies gpupool into a volume, the container's command runs
    under `gpuattach run -n 1 -p 0.5` with its args untouched, the client token comes from the
    namespace's Secret, and the patched pod is still a valid v1 Pod."""
    review = fixture("pod-create-fraction.json")
    response, pod = admit(webhook, review)
    assert response["allowed"] is True
    spec = pod["spec"]
    assert {"name": "gpupool", "emptyDir": {}} in spec["volumes"]
    (init,) = spec["initContainers"]
    assert init["image"] == IMAGE
    assert init["command"][:2] == ["cp", "-R"]
    copied_into = init["command"][3].rstrip("/")
    assert {"name": "gpupool", "mountPath": copied_into} in init["volumeMounts"]
    (train,) = spec["containers"]
    cmd = train["command"]
    assert cmd[0] == "/opt/gpupool/bin/gpuattach" and cmd[1] == "run"
    dash = cmd.index("--")
    assert cmd[dash + 1 :] == ["python", "train.py"]
    wrapper = cmd[2:dash]
    assert wrapper[wrapper.index("-n") + 1] == "1" and wrapper[wrapper.index("-p") + 1] == "0.5"
    assert wrapper[wrapper.index("--server") + 1] == "gpu1.example.org:56001"
    assert train["args"] == ["--epochs", "10"]
    assert any(m["mountPath"] == "/opt/gpupool" and m["name"] == "gpupool" for m in train["volumeMounts"])
    env = {e["name"]: e for e in train["env"]}
    assert env["GPUPOOL_TOKEN"]["valueFrom"] == {"secretKeyRef": {"name": "gpupool-token", "key": "token"}}
    assert env["XDG_CACHE_HOME"]["value"].startswith("/opt/gpupool/")
    assert pod["metadata"]["annotations"]["gpupool.io/injected"] == "0.5"
    k8s_models.load(pod)


def test_the_pod_of_the_docs_is_admitted_as_the_docs_say(webhook):
    """The example pod of docs/schedulers.md, sent as the API server would, comes back wrapped in
    `gpuattach run -n 1 -p 0.5` around its command."""
    import yaml

    text = (ROOT / "docs" / "schedulers.md").read_text()
    pod = yaml.safe_load(text.split("```yaml\n", 1)[1].split("```", 1)[0])
    review = fixture("pod-create-fraction.json")
    review["request"]["object"] = pod
    response, patched = admit(webhook, review)
    assert response["allowed"] is True
    (container,) = patched["spec"]["containers"]
    command = container["command"]
    assert command[:6] == ["/opt/gpupool/bin/gpuattach", "run", "-n", "1", "-p", "0.5"]
    assert command[command.index("--") + 1 :] == pod["spec"]["containers"][0]["command"]
    k8s_models.load(patched)


def test_only_the_named_container_is_wrapped_and_the_pods_own_volumes_env_and_init_stay(webhook):
    """A pod with a training container and a log shipper, its own volume, env and init container:
    gpupool.io/containers picks "train"; the sidecar is untouched, nothing of the pod is lost, and
    sm-share, filter and timeout reach gpuattach."""
    review = fixture("pod-create-multi.json")
    before = review["request"]["object"]
    response, pod = admit(webhook, review)
    assert response["allowed"] is True
    spec = pod["spec"]
    assert [v["name"] for v in spec["volumes"]] == ["data", "gpupool"]
    assert [c["name"] for c in spec["initContainers"]] == ["gpupool-install", "fetch"]
    assert spec["initContainers"][1] == before["spec"]["initContainers"][0]
    train, shipper = spec["containers"]
    assert shipper == before["spec"]["containers"][1]
    cmd = train["command"]
    assert cmd[cmd.index("--") + 1 :] == ["torchrun", "--nproc-per-node=2", "train.py"]
    wrapper = cmd[: cmd.index("--")]
    for option, value in [("-n", "2"), ("-p", "0.5"), ("--sm-share", "0.5"),
                          ("--filter", "device.name=H100"), ("--timeout", "30m")]:  # fmt: skip
        assert wrapper[wrapper.index(option) + 1] == value
    assert {"name": "EPOCHS", "value": "90"} in train["env"]
    assert {"name": "data", "mountPath": "/data", "readOnly": True} in train["volumeMounts"]
    k8s_models.load(pod)


def test_lists_given_as_null_are_filled_not_appended_to(webhook):
    """A pod whose volumes, env and volumeMounts are present but null (as some generators write them)
    gets them as lists holding gpupool's entries."""
    review = fixture("pod-create-fraction.json")
    pod = review["request"]["object"]
    pod["spec"]["volumes"] = None
    pod["spec"]["containers"][0].update(env=None, volumeMounts=None)
    response, patched = admit(webhook, review)
    assert response["allowed"] is True
    assert [v["name"] for v in patched["spec"]["volumes"]] == ["gpupool"]
    (c,) = patched["spec"]["containers"]
    assert [m["mountPath"] for m in c["volumeMounts"]] == ["/opt/gpupool"]
    assert {e["name"] for e in c["env"]} == {"GPUPOOL_TOKEN", "XDG_CACHE_HOME"}


def test_the_init_containers_copy_works_as_its_non_root_user_and_leaves_the_volume_writable():
    """The init container's command, run on a stand-in for the image's /opt/gpupool as the user its
    securityContext names (when this test runs as root), copies files with their modes and symbolic
    links as links, and leaves the volume's directory writable for a container of another user (the
    shim's cache goes there)."""
    import tempfile

    # Not under pytest's tmp_path: its parents are private to this user, the copying user needs a way in.
    with tempfile.TemporaryDirectory() as top:
        _copy_as_the_init_container(Path(top), shutil.which("setpriv") if os.geteuid() == 0 else None)


def _copy_as_the_init_container(tmp_path: Path, setpriv: str | None) -> None:
    from server._admission import _COPY_TO, INSTALL_DIR, WebhookOptions, mutate

    image, volume = tmp_path / "image", tmp_path / "volume"
    (image / "bin").mkdir(parents=True)
    (image / "venv" / "bin").mkdir(parents=True)
    (image / "venv" / "bin" / "gpuattach").write_text("#!/bin/sh\n")
    (image / "venv" / "bin" / "gpuattach").chmod(0o755)
    (image / "bin" / "gpuattach").symlink_to("../venv/bin/gpuattach")
    for d in (tmp_path, image, image / "bin", image / "venv", image / "venv" / "bin"):
        d.chmod(0o755)
    volume.mkdir(mode=0o777)
    volume.chmod(0o777)  # an emptyDir
    pod = fixture("pod-create-fraction.json")["request"]["object"]
    patch = mutate(pod, WebhookOptions(image=IMAGE, servers=["gpu1:56001"]))
    (init,) = next(op["value"] for op in patch if op["path"] == "/spec/initContainers")
    assert init["securityContext"]["runAsNonRoot"] is True
    command = [a.replace(INSTALL_DIR, str(image)).replace(_COPY_TO, str(volume)) for a in init["command"]]
    user = init["securityContext"]["runAsUser"]
    as_user = [setpriv, f"--reuid={user}", f"--regid={user}", "--clear-groups"] if setpriv else []
    run = subprocess.run([*as_user, *command], capture_output=True, text=True, timeout=30)
    assert run.returncode == 0, run.stderr
    assert (volume / "bin" / "gpuattach").is_symlink()
    assert os.access(volume / "venv" / "bin" / "gpuattach", os.X_OK)
    other = [setpriv, "--reuid=4321", "--regid=4321", "--clear-groups"] if setpriv else []
    subprocess.run([*other, "mkdir", str(volume / "cache")], check=True, timeout=30)


def test_pods_without_the_annotation_and_pods_already_injected_pass_untouched(webhook):
    """A pod that does not ask for pooled GPUs is allowed with no patch; so is one the webhook already
    rewrote (a reinvocation must not wrap gpuattach in gpuattach)."""
    response, _ = admit(webhook, fixture("pod-create-plain.json"))
    assert response["allowed"] is True and "patch" not in response
    review = fixture("pod-create-fraction.json")
    _, injected = admit(webhook, review)
    review["request"]["object"] = injected
    response, again = admit(webhook, review)
    assert response["allowed"] is True and "patch" not in response
    assert again == injected


ASKS = [
    ({"gpupool.io/gpu": "0.5"}, {"num_gpus": 1, "partial": 0.5, "memory": None}),
    ({"gpupool.io/gpu": "2"}, {"num_gpus": 2, "partial": 1.0, "memory": None}),
    ({"gpupool.io/gpu": "4x0.25"}, {"num_gpus": 4, "partial": 0.25, "memory": None}),
    ({"gpupool.io/gpu": "0.1234567"}, {"num_gpus": 1, "partial": 0.1234567, "memory": None}),
    ({"gpupool.io/gpu": "1x16Gi"}, {"num_gpus": 1, "partial": None, "memory": 16384}),
    ({"gpupool.io/gpu": "2x 512Mi"}, {"num_gpus": 2, "partial": None, "memory": 512}),
    (
        {"gpupool.io/gpu": "0.5", "gpupool.io/sm-share": "0.25", "gpupool.io/timeout": "90s",
         "gpupool.io/filter": "device.name=H100;  device.phy-memory>=40000 "},
        {"num_gpus": 1, "partial": 0.5, "sm_share": 0.25, "timeout": "90s",
         "filter": ["device.name=H100", "device.phy-memory>=40000"]},
    ),
]  # fmt: skip


@pytest.mark.parametrize(("annotations", "parsed"), ASKS, ids=[json.dumps(a) for a, _ in ASKS])
def test_gpuattach_reads_the_wrapper_as_the_pod_asked(annotations, parsed):
    """The wrapper the patch writes is read by gpuattach's own argument parser as the annotations
    meant it: the GPU count, share or memory, SM share, filters, timeout, the pool's servers and the
    container's original command after `--`."""
    from server._admission import WebhookOptions, mutate
    from virtualize.client.cli import _parser

    pod = fixture("pod-create-fraction.json")["request"]["object"]
    pod["metadata"]["annotations"] = annotations
    patch = mutate(pod, WebhookOptions(image=IMAGE, servers=["gpu1:56001", "gpu2:56001"]))
    (command,) = [op["value"] for op in patch if op["path"] == "/spec/containers/0/command"]
    args = _parser().parse_args(command[1:])
    assert args.command == "run"
    for name, value in parsed.items():
        assert getattr(args, name) == value, name
    assert args.server == ["gpu1:56001,gpu2:56001"]
    assert args.cmd == ["--", "python", "train.py"]


BAD_PODS = [
    ({"gpupool.io/gpu": "1.5"}, "gpupool.io/gpu"),
    ({"gpupool.io/gpu": "half"}, "gpupool.io/gpu"),
    ({"gpupool.io/gpu": "0"}, "gpupool.io/gpu"),
    ({"gpupool.io/gpu": "2x1.5"}, "gpupool.io/gpu"),
    ({"gpupool.io/gpu": "0.001"}, "gpupool.io/gpu"),
    ({"gpupool.io/gpu": "0.5", "gpupool.io/sm-share": "2"}, "gpupool.io/sm-share"),
    ({"gpupool.io/gpu": "0.5", "gpupool.io/sm-share": "lots"}, "gpupool.io/sm-share"),
    ({"gpupool.io/gpu": "0.5", "gpupool.io/filter": "colour=blue"}, "gpupool.io/filter"),
    ({"gpupool.io/gpu": "0.5", "gpupool.io/timeout": "soon"}, "gpupool.io/timeout"),
    ({"gpupool.io/gpus": "0.5"}, "gpupool.io/gpus"),
    ({"gpupool.io/sm-share": "0.5"}, "gpupool.io/gpu"),
    ({"gpupool.io/gpu": "0.5", "gpupool.io/containers": "trainer"}, "trainer"),
    ({"gpupool.io/gpu": "0.5", "gpupool.io/token-secret": "My Token"}, "gpupool.io/token-secret"),
]


@pytest.mark.parametrize(("annotations", "named"), BAD_PODS, ids=[json.dumps(a) for a, _ in BAD_PODS])
def test_a_bad_request_is_denied_with_a_message_naming_it(webhook, annotations, named):
    """A pod whose gpupool.io annotations cannot be served is refused (allowed=false, HTTP 200, the
    request's uid) with a message naming the annotation — never a 500, never a pod without GPUs."""
    review = fixture("pod-create-fraction.json")
    review["request"]["object"]["metadata"]["annotations"] = annotations
    response, _ = admit(webhook, review)
    assert response["allowed"] is False
    assert named in response["status"]["message"]
    assert "patch" not in response


def test_pods_the_webhook_cannot_wrap_are_denied(webhook):
    """A container without a command (the image's ENTRYPOINT is invisible to the webhook) and a
    two-container pod that does not say which container takes the lease are refused, naming why."""
    review = fixture("pod-create-fraction.json")
    del review["request"]["object"]["spec"]["containers"][0]["command"]
    response, _ = admit(webhook, review)
    assert response["allowed"] is False and "command" in response["status"]["message"]
    review = fixture("pod-create-multi.json")
    del review["request"]["object"]["metadata"]["annotations"]["gpupool.io/containers"]
    response, _ = admit(webhook, review)
    assert response["allowed"] is False and "gpupool.io/containers" in response["status"]["message"]


def test_malformed_reviews_are_denied_not_errors(webhook):
    """Not JSON, JSON that is not a review, a v1beta1 review, a review without a uid, and the
    reference's own Scale example (not a pod: misconfigured rules) all get HTTP 200 with allowed=false
    and a message."""
    scale = fixture("scale-update.json")
    beta = fixture("pod-create-fraction.json")
    beta["apiVersion"] = "admission.k8s.io/v1beta1"
    no_uid = fixture("pod-create-fraction.json")
    del no_uid["request"]["uid"]
    for body in [b"{not json", b"[]", json.dumps(beta).encode(), json.dumps(no_uid).encode(),
                 json.dumps(scale).encode()]:  # fmt: skip
        status, answer = webhook.post(body)
        assert status == 200
        assert answer["response"]["allowed"] is False
        assert answer["response"]["status"]["message"]
    status, answer = webhook.post(scale)
    assert answer["response"]["uid"] == scale["request"]["uid"]


SHAPELESS = [
    ("spec", "containers", ["train"]),
    ("spec", "volumes", "data"),
    ("spec", "initContainers", {"name": "x"}),
    ("container", "env", 5),
    ("container", "volumeMounts", ["/data"]),
    ("container", "command", "python train.py"),
]


@pytest.mark.parametrize(("where", "key", "value"), SHAPELESS, ids=[f"{w}.{k}" for w, k, _ in SHAPELESS])
def test_a_pod_of_the_wrong_shape_is_denied_not_an_error(webhook, where, key, value):
    """A review whose pod has a list, string or number where the Pod schema has something else is
    answered with a denial (HTTP 200, allowed=false, a message), not a server error."""
    review = fixture("pod-create-fraction.json")
    pod = review["request"]["object"]
    (pod["spec"] if where == "spec" else pod["spec"]["containers"][0])[key] = value
    response, _ = admit(webhook, review)
    assert response["allowed"] is False and response["status"]["message"]


BAD_OPTIONS = [
    ["--image", IMAGE],
    ["--image", "", "--pool-server", "gpu1:56001"],
    ["--image", IMAGE, "--pool-server", "gpu1:99999"],
    ["--image", IMAGE, "--pool-cluster", "gpu1:2379"],
    ["--image", IMAGE, "--pool-server", "gpu1:56001", "--token-secret", "Team Token"],
    ["--image", IMAGE, "--pool-server", "gpu1:56001", "--port", "0", "--tls-cert", "/nonexistent.crt",
     "--tls-key", "/nonexistent.key"],
    ["--image", IMAGE, "--pool-server", "gpu1:56001", "--port", "0", "--tls-cert", "/nonexistent.crt"],
]  # fmt: skip


@pytest.mark.parametrize("args", BAD_OPTIONS, ids=[" ".join(a[2:]) or "no pool" for a in BAD_OPTIONS])
def test_the_webhook_refuses_bad_options_in_one_line(args):
    """`gpupool-server webhook` without a pool, with an empty image, a bad server address, cluster URL
    or Secret name, or a TLS certificate that does not exist (or no key), exits 2 with one line on
    stderr and no traceback."""
    proc = subprocess.run(
        [*server_cmd(), "webhook", *args], capture_output=True, text=True, timeout=30, cwd=ROOT
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_the_wrapped_command_holds_a_lease_while_it_runs_and_releases_it_at_pod_end(tmp_path, webhook):
    """The command the patch gives a container, run here against a real gpupool-server (simulated GPUs,
    the host executor for remote leases): it runs with a lease, and the lease is released when the
    command ends and when the "pod" is stopped (SIGTERM to the container's first process, as the
    kubelet sends it)."""
    server = ServerProc(tmp_path / "srv", gpus="2xH100-80GB", env={"GPUPOOL_WORKER_EXECUTOR": "host"}).start()
    try:
        token = server.token("ml-team")
        review = fixture("pod-create-fraction.json")
        host = server.url.removeprefix("http://")

        def container_command(user_command: list[str]) -> tuple[list[str], dict]:
            review["request"]["object"]["spec"]["containers"][0]["command"] = user_command
            review["request"]["object"]["spec"]["containers"][0].pop("args", None)
            _, pod = admit(webhook, review)
            (c,) = pod["spec"]["containers"]
            cmd = c["command"]
            # /opt/gpupool/bin/gpuattach is this checkout's gpuattach; the pool is the test server.
            cmd = [*gpuattach_cmd(), *cmd[1:]]
            cmd[cmd.index("--server") + 1] = host
            env = {
                "GPUPOOL_TOKEN": token,
                "XDG_CACHE_HOME": str(tmp_path / "cache"),
                "PATH": "/usr/bin:/bin",
                "PYTHONPATH": os.environ.get("PYTHONPATH", ""),
            }
            return cmd, env

        cmd, env = container_command(["sh", "-c", 'echo "lease=$GPUPOOL_LEASE"'])
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60, cwd=ROOT)
        assert done.returncode == 0 and "lease=" in done.stdout, (done.stdout, done.stderr)
        lease = done.stdout.split("lease=")[1].split()[0]
        status, body = api(server.url, "GET", f"/v1/leases/{lease}", token=token)
        assert status == 200 and body["state"] == "released"

        cmd, env = container_command(["sh", "-c", 'echo "lease=$GPUPOOL_LEASE"; exec sleep 60'])
        # As in a container, gpuattach is process 1 of its own PID namespace where that can be made:
        # process 1 gets only the signals it handles, so this proves gpuattach handles SIGTERM.
        pid_ns = os.geteuid() == 0 and shutil.which("unshare")
        wrap = [pid_ns, "--pid", "--fork", "--"] if pid_ns else []
        proc = subprocess.Popen(
            [*wrap, *cmd], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT
        )
        ready, _, _ = select.select([proc.stdout], [], [], 60)
        line = proc.stdout.readline().decode() if ready else ""
        assert line.startswith("lease="), proc.stderr.read1().decode() if not ready else line
        lease = line.strip().split("=")[1]
        assert api(server.url, "GET", f"/v1/leases/{lease}", token=token)[1]["state"] == "active"
        first = proc.pid
        if pid_ns:  # the kubelet signals the container's process 1: unshare's child
            first = int(Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()[0])
        os.kill(first, signal.SIGTERM)
        proc.wait(timeout=30)
        deadline = time.monotonic() + 10
        while api(server.url, "GET", f"/v1/leases/{lease}", token=token)[1]["state"] == "active":
            assert time.monotonic() < deadline, "the lease outlived the stopped pod"
            time.sleep(0.1)
        assert api(server.url, "GET", f"/v1/leases/{lease}", token=token)[1]["state"] == "released"
    finally:
        server.stop()
