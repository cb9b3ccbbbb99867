"""Kubernetes admission: a pod that asks for pooled GPUs becomes a pod that takes a lease.

A pod asks with annotations (docs/schedulers.md, Kubernetes):

    gpupool.io/gpu: "0.5"            one GPU, half of its memory   (also "2x0.5", "2" = 2 whole GPUs,
                                     "1x16Gi" / "1x16384Mi" = a partition by memory)
    gpupool.io/sm-share: "0.5"       optional, as gpuattach --sm-share
    gpupool.io/filter: "device.name=H100; device.phy-memory>=40000"   optional, as --filter (';' between)
    gpupool.io/timeout: "10m"        optional, how long the container waits for free GPUs
    gpupool.io/containers: "train"   which containers (comma-separated); needed when the pod has several
    gpupool.io/token-secret: "NAME"  the Secret (key "token") with the client token; default gpupool-token

``review(body, options)`` answers one AdmissionReview v1 with another: pods without ``gpupool.io/gpu``
pass untouched; a valid request gets a JSON patch (RFC 6902) that adds a volume, an init container
copying gpupool from its image into that volume, and wraps each chosen container's command in
``gpuattach run`` (a lease at container start, released when the command ends or the pod is stopped;
the pool's TTL reclaims it after a SIGKILL). Everything else is denied with ``allowed: false`` and a
one-line message the user sees in ``kubectl`` — never an HTTP error.
"""

from __future__ import annotations

import base64
import json
import math
import re
from dataclasses import dataclass, field

from collector import durations
from server import ranges
from server._errors import BadRequest, PoolError
from server._filters import parse_filter
from server.errors import ServerError

API_VERSION = "admission.k8s.io/v1"
PREFIX = "gpupool.io/"
GPU = PREFIX + "gpu"
INJECTED = PREFIX + "injected"  # set by the patch: a pod seen again (reinvocation) is left alone
OPTIONAL = {
    PREFIX + "sm-share": "as gpuattach --sm-share, e.g. 0.5",
    PREFIX + "filter": "as gpuattach --filter, several separated by ';'",
    PREFIX + "timeout": "how long to wait for free GPUs, e.g. 10m",
    PREFIX + "containers": "the containers that take a lease, comma-separated",
    PREFIX + "token-secret": "the Secret holding the client token under key 'token'",
}
KNOWN = {GPU, INJECTED, *OPTIONAL}

# The image's contract (deploy/kubernetes/Dockerfile): a gpupool install under INSTALL_DIR with
# bin/gpuattach. The pod's containers mount the copy at the same path, so nothing needs relocating.
INSTALL_DIR = "/opt/gpupool"
VOLUME = "gpupool"
INIT_CONTAINER = "gpupool-install"
_COPY_TO = "/mnt/gpupool"


@dataclass
class WebhookOptions:
    """How the webhook rewrites pods: where the pool is and which image carries gpupool."""

    image: str
    servers: list[str] = field(default_factory=list)  # gpuattach --server, comma-joined
    cluster: str | None = None  # gpuattach --cluster etcd://...
    token_secret: str = "gpupool-token"
    image_pull_policy: str = "IfNotPresent"


class Denied(ServerError):
    """A pod (or a review) the webhook refuses; the title is what kubectl shows."""


@dataclass
class GpuRequest:
    n: int
    fraction: float | None = None
    mem_mib: int | None = None

    def args(self) -> list[str]:
        size = ["-m", str(self.mem_mib)] if self.mem_mib is not None else ["-p", repr(self.fraction)]
        return ["-n", str(self.n), *size]


_SIZE = re.compile(r"\s*(?:(\d+)\s*[xX×]\s*)?(\d+(?:\.\d*)?|\.\d+)\s*(Mi|Gi)?\s*", re.ASCII)


# A Secret's name: a DNS subdomain (RFC 1123), as the API server requires.
_SECRET_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")


def secret_name_problem(name: str) -> str | None:
    """Why ``name`` cannot name a Secret (None: it can)."""
    if _SECRET_NAME.fullmatch(name):
        return None
    return f"{name!r} is not a Secret name (lower-case letters, digits, '-' and '.', at most 253)"


def parse_gpu(text: str) -> GpuRequest:
    """``0.5`` one GPU's half, ``2x0.5`` two halves, ``2`` two whole GPUs, ``1x16Gi`` 16 GiB of one."""
    how = f'write e.g. "0.5", "2x0.5", "2" or "1x16Gi" in {GPU}'
    m = _SIZE.fullmatch(text)
    if not m:
        raise Denied(f"{GPU}: {text!r} is not a GPU request ({how})")
    count, size, unit = m.group(1), float(m.group(2)), m.group(3)
    if unit:
        req = GpuRequest(int(count or 1), mem_mib=size * (1024 if unit == "Gi" else 1))
        if req.mem_mib != int(req.mem_mib):
            raise Denied(f"{GPU}: {text!r} is not a whole number of MiB ({how})")
        req.mem_mib = int(req.mem_mib)
    elif count is not None:
        req = GpuRequest(int(count), fraction=size)
    elif size <= 1:
        req = GpuRequest(1, fraction=size)
    elif size == int(size):
        req = GpuRequest(int(size), fraction=1.0)
    else:
        raise Denied(
            f"{GPU}: {text!r} is not a whole number of GPUs; a lease is N GPUs of one size each "
            f'(write e.g. "2x0.75")'
        )
    for name in ("n", "fraction", "mem_mib"):
        value = getattr(req, name)
        if value is not None and (why := ranges.problem(ranges.REQUEST, name, value)):
            raise Denied(f"{GPU}: {text!r}: {why} ({how})")
    return req


def _options(annotations: dict[str, str]) -> list[str]:
    """The optional annotations as gpuattach options, each checked the way gpuattach checks it."""
    args: list[str] = []
    if (share := annotations.get(PREFIX + "sm-share")) is not None:
        try:
            value = float(share)
        except ValueError:
            raise Denied(f"{PREFIX}sm-share: {share!r} is not a number (e.g. 0.5)") from None
        if why := ranges.problem(ranges.REQUEST, "sm_share", value):
            raise Denied(f"{PREFIX}sm-share: {why}")
        args += ["--sm-share", repr(value)]  # the shortest text of exactly this number
    for text in (annotations.get(PREFIX + "filter") or "").split(";"):
        if text.strip():
            try:
                parse_filter(text.strip())
            except PoolError as exc:
                raise Denied(f"{PREFIX}filter: {exc.title}") from None
            args += ["--filter", text.strip()]
    if (timeout := annotations.get(PREFIX + "timeout")) is not None:
        try:
            seconds = durations.setting(timeout, f"{PREFIX}timeout", BadRequest)
        except BadRequest as exc:
            raise Denied(f"{exc.title} ({exc.hint})") from None
        if not (0 < seconds < math.inf):
            raise Denied(f"{PREFIX}timeout: {timeout!r} is not a positive duration (e.g. 10m)")
        args += ["--timeout", timeout.strip()]
    return args


def _chosen(pod: dict, annotations: dict[str, str]) -> list[int]:
    containers = pod["spec"]["containers"]
    names = [c.get("name") for c in containers]
    wanted = annotations.get(PREFIX + "containers")
    if wanted is None:
        if len(containers) > 1:
            raise Denied(
                f"the pod has {len(containers)} containers: name the ones that take a lease in "
                f'{PREFIX}containers (e.g. "{names[0]}")'
            )
        return [0]
    chosen = []
    for name in (part.strip() for part in wanted.split(",")):
        if not name:
            continue
        if name not in names:
            raise Denied(f"{PREFIX}containers names {name!r}, which is not a container of the pod")
        if names.index(name) not in chosen:
            chosen.append(names.index(name))
    if not chosen:
        raise Denied(f"{PREFIX}containers is empty (name at least one container)")
    return chosen


def _escape(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def mutate(pod: dict, options: WebhookOptions) -> list[dict]:
    """The JSON patch for ``pod`` (empty when it does not ask for pooled GPUs)."""
    meta = pod.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    if not isinstance(annotations, dict):
        raise Denied("metadata.annotations is not a map")
    ours = {k: v for k, v in annotations.items() if k.startswith(PREFIX)}
    if INJECTED in ours:
        return []
    for key in ours:
        if key not in KNOWN:
            raise Denied(f"unknown annotation {key} (known: {', '.join(sorted(KNOWN - {INJECTED}))})")
    if GPU not in ours:
        if ours:
            raise Denied(f"{', '.join(sorted(ours))} without {GPU}: say how many GPUs the pod takes")
        return []
    if not all(isinstance(v, str) for v in ours.values()):
        raise Denied("gpupool.io annotations must be strings")
    spec = pod.get("spec")
    if not isinstance(spec, dict) or not isinstance(spec.get("containers"), list) or not spec["containers"]:
        raise Denied("the pod has no spec.containers")
    request = parse_gpu(ours[GPU])
    run_args = ["run", *request.args(), *_options(ours)]
    if options.servers:
        run_args += ["--server", ",".join(options.servers)]
    if options.cluster:
        run_args += ["--cluster", options.cluster]
    secret = ours.get(PREFIX + "token-secret", options.token_secret)
    if why := secret_name_problem(secret):
        raise Denied(f"{PREFIX}token-secret: {why}")

    volumes = spec.get("volumes") or []
    inits = spec.get("initContainers") or []
    if any(v.get("name") == VOLUME for v in volumes):
        raise Denied(f"the pod already has a volume named {VOLUME!r}, which gpupool adds")
    if any(c.get("name") == INIT_CONTAINER for c in inits):
        raise Denied(f"the pod already has an init container named {INIT_CONTAINER!r}, which gpupool adds")

    patch: list[dict] = [
        {"op": "add", "path": f"/metadata/annotations/{_escape(INJECTED)}", "value": ours[GPU]},
    ]
    volume = {"name": VOLUME, "emptyDir": {}}
    patch.append(
        {"op": "add", "path": "/spec/volumes/-", "value": volume}
        if spec.get("volumes")
        else {"op": "add", "path": "/spec/volumes", "value": [volume]}
    )
    init = {
        "name": INIT_CONTAINER,
        "image": options.image,
        "imagePullPolicy": options.image_pull_policy,
        # -R, not -a: it leaves the volume's own directory world-writable (emptyDir's 0777), so a
        # container of any user creates its shim cache there, and a non-root copy does not fail
        # setting the times of a directory it does not own. Symbolic links stay links.
        "command": ["cp", "-R", f"{INSTALL_DIR}/.", f"{_COPY_TO}/"],
        "volumeMounts": [{"name": VOLUME, "mountPath": _COPY_TO}],
        # What namespaces with a ResourceQuota (limits required) or the "restricted" Pod Security
        # Standard demand of every container.
        "resources": {
            "requests": {"cpu": "10m", "memory": "32Mi"},
            "limits": {"cpu": "1", "memory": "128Mi"},
        },
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": 65532,
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
    }
    # First, so that the copy is there before any other init container could want it.
    patch.append(
        {"op": "add", "path": "/spec/initContainers/0", "value": init}
        if inits
        else {"op": "add", "path": "/spec/initContainers", "value": [init]}
    )
    for i in _chosen(pod, ours):
        patch += _wrap(spec["containers"][i], f"/spec/containers/{i}", run_args, secret)
    return patch


def _wrap(container: dict, at: str, run_args: list[str], secret: str) -> list[dict]:
    name = container.get("name")
    command = container.get("command")
    if not command:
        raise Denied(
            f"container {name!r} has no command: gpupool wraps the command in gpuattach run and cannot see "
            "the image's ENTRYPOINT (set command: to what the image runs)"
        )
    if not isinstance(command, list) or not all(isinstance(part, str) for part in command):
        raise Denied(f"container {name!r}: command is not a list of strings")
    mounts = container.get("volumeMounts") or []
    if any(m.get("mountPath", "").rstrip("/") == INSTALL_DIR for m in mounts):
        raise Denied(f"container {name!r} already mounts something at {INSTALL_DIR}, where gpupool goes")
    out = [
        {
            "op": "replace",
            "path": f"{at}/command",
            "value": [f"{INSTALL_DIR}/bin/gpuattach", *run_args, "--", *command],
        }
    ]
    mount = {"name": VOLUME, "mountPath": INSTALL_DIR, "readOnly": False}
    out.append(
        {"op": "add", "path": f"{at}/volumeMounts/-", "value": mount}
        if container.get("volumeMounts")
        else {"op": "add", "path": f"{at}/volumeMounts", "value": [mount]}
    )
    have = {e.get("name") for e in container.get("env") or []}
    env = [
        # The user's own GPUPOOL_TOKEN (another source) wins; else the namespace's Secret.
        {"name": "GPUPOOL_TOKEN", "valueFrom": {"secretKeyRef": {"name": secret, "key": "token"}}},
        # The shim's link directory (virtualize.client.remote.shim_dir) on the writable volume: HOME may be read-only.
        {"name": "XDG_CACHE_HOME", "value": f"{INSTALL_DIR}/cache"},
    ]
    env = [e for e in env if e["name"] not in have]
    if container.get("env"):
        out += [{"op": "add", "path": f"{at}/env/-", "value": e} for e in env]
    elif env:
        out.append({"op": "add", "path": f"{at}/env", "value": env})
    return out


def review(body: object, options: WebhookOptions) -> dict:
    """The AdmissionReview v1 answer to ``body`` (a decoded request): always a review, never a raise."""
    uid = ""
    try:
        if not isinstance(body, dict):
            raise Denied("the request body is not an AdmissionReview object")
        request = body.get("request")
        if isinstance(request, dict) and isinstance(request.get("uid"), str):
            uid = request["uid"]
        if body.get("apiVersion") != API_VERSION or body.get("kind") != "AdmissionReview":
            raise Denied(
                f"expected an AdmissionReview of {API_VERSION}, got kind {body.get('kind')!r} of "
                f"{body.get('apiVersion')!r} (set admissionReviewVersions: [v1])"
            )
        if not isinstance(request, dict) or not uid:
            raise Denied("the AdmissionReview has no request with a uid")
        kind = request.get("kind") or {}
        if not isinstance(kind, dict) or (kind.get("group"), kind.get("kind")) != ("", "Pod"):
            raise Denied(f"this webhook admits pods only, not {kind!r} (check the webhook's rules)")
        if request.get("operation") != "CREATE":
            return _answer(uid, [])  # the rules send only CREATE; anything else passes unchanged
        pod = request.get("object")
        if not isinstance(pod, dict):
            raise Denied("the AdmissionReview's request has no object (the pod)")
        try:
            return _answer(uid, mutate(pod, options))
        except (AttributeError, TypeError, KeyError) as exc:
            # The API server decodes a pod into its typed struct before admission, so only a hand-made
            # review gets here (a list where a map belongs ...): refused, never a 500.
            raise Denied(f"the pod is not shaped as a v1 Pod ({type(exc).__name__}: {exc})") from None
    except Denied as exc:
        return {
            "apiVersion": API_VERSION,
            "kind": "AdmissionReview",
            "response": {
                "uid": uid,
                "allowed": False,
                "status": {"code": 400, "reason": "BadRequest", "message": f"gpupool: {exc}"},
            },
        }


def _answer(uid: str, patch: list[dict]) -> dict:
    response: dict = {"uid": uid, "allowed": True}
    if patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(json.dumps(patch).encode()).decode()
    return {"apiVersion": API_VERSION, "kind": "AdmissionReview", "response": response}
