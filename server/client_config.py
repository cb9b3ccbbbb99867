"""gpuattach's configuration: the pool (a list of servers) and the client's token.

Looked up in order: ``--config PATH``, ``$GPUPOOL_CONFIG``, ``~/.config/gpupool/client.toml``
(``$XDG_CONFIG_HOME`` respected). ``--server`` and ``--token`` (or ``$GPUPOOL_TOKEN``) override it.

    token = "gp_..."                         # the client's token (gpupool-server token create NAME)
    servers = ["gpu1:56001", "https://gpu2:56001"]
    cluster = "etcd://etcd1:2379,etcd2:2379,etcd3:2379"   # or: discover the servers of a cluster
    # a server with its own token:  servers = [{ url = "gpu3:56001", token = "gp_..." }]
    ca_cert = "/etc/gpupool/ca.pem"          # to trust a server's self-signed TLS certificate
    timeout = "10m"                          # how long run/request wait for GPUs by default
"""

from __future__ import annotations

import os
import re
import tomllib
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

from collector import durations
from server.client_errors import ConfigError
from server.ranges import MAX_SECONDS, Range

DEFAULT_PORT = 56001
DEFAULT_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class ServerRef:
    url: str
    token: str | None


@dataclass
class ClientConfig:
    servers: list[ServerRef] = field(default_factory=list)
    token: str | None = None
    ca_cert: str | None = None
    cluster: str | None = None  # etcd://h1:2379,...: the servers registered there join `servers`
    timeout_s: float = DEFAULT_TIMEOUT_S
    path: Path | None = None

    def token_for(self, server: ServerRef) -> str | None:
        return server.token or self.token


WAIT = Range(0, MAX_SECONDS, "s")  # how long run/request wait for GPUs (a century is "forever" already)


def wait_setting(value: object, what: str) -> float:
    """How long to wait for GPUs (client.toml's timeout, gpuattach --timeout), within ``WAIT``."""
    seconds = durations.setting(value, what, ConfigError)
    if why := WAIT.problem(seconds):
        raise ConfigError(f"{what}: {why}", f"write e.g. {durations.EXAMPLES}")
    return seconds


def normalize_url(text: str, default_port: int | None = DEFAULT_PORT) -> str:
    """``gpu1`` -> ``http://gpu1:56001``; ``gpu1:7000`` -> ``http://gpu1:7000``; URLs stay.

    The one normaliser of server URLs (gpuattach, its config, the console); ``default_port=None``
    leaves a URL without a port as it is (the console's Prometheus endpoints)."""
    text = text.strip().rstrip("/")
    if not text:
        raise ConfigError("empty server address", "write host:port or http(s)://host:port")
    if "://" not in text:
        text = "http://" + text
    scheme, rest = text.split("://", 1)
    if scheme not in ("http", "https"):
        raise ConfigError(
            f"not a server URL: {text!r} (scheme {scheme!r} is not http or https)", "e.g. https://gpu1:56001"
        )
    host = rest.split("/", 1)[0]
    if default_port is not None and not re.search(r":[^:\]]*$", host.removeprefix("[")):
        rest = host + f":{default_port}" + rest[len(host) :]
    url = f"{scheme}://{rest}"
    # Checked here, once, so a bad port is named as one (not found later by the HTTP library).
    parts = urllib.parse.urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = 0
    if port == 0 or not re.fullmatch(r"(\[[0-9A-Fa-f:.]+\]|[^:\[\]@]+)(:\d+)?", parts.netloc):
        raise ConfigError(
            f"server address {text.removeprefix('http://')!r} is not HOST:PORT with a port 1-65535",
            "write host:port, e.g. gpu1:56001 or https://gpu1:56001",
        )
    return url


def default_path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "gpupool" / "client.toml"


def check_cluster_url(url: str) -> str:
    url = url.strip()
    hosts = url.removeprefix("etcd://").split(",")
    if not url.startswith("etcd://") or not all(re.fullmatch(r"[^:/\s]+:\d+", h) for h in hosts):
        raise ConfigError(
            f"cluster {url!r} is not an etcd URL", "write etcd://host1:2379,host2:2379,host3:2379"
        )
    return url


def load(
    path: str | None = None,
    servers: list[str] | None = None,
    token: str | None = None,
    cluster: str | None = None,
) -> ClientConfig:
    chosen = path or os.environ.get("GPUPOOL_CONFIG")
    cfg = ClientConfig()
    file = Path(chosen) if chosen else default_path()
    if file.exists():
        try:
            data = tomllib.loads(file.read_text())
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{file} is not valid TOML: {exc}", "see deploy/client.toml") from None
        except OSError as exc:
            raise ConfigError(f"cannot read {file}: {exc.strerror}", "check its permissions") from None
        cfg.path = file
        unknown = set(data) - {"token", "servers", "ca_cert", "timeout", "cluster"}
        if unknown:
            raise ConfigError(
                f"{file}: unknown key(s) {', '.join(sorted(unknown))}",
                "known: token, servers, cluster, ca_cert, timeout",
            )
        if data.get("cluster"):
            cfg.cluster = check_cluster_url(str(data["cluster"]))
        cfg.token = (data.get("token") or "").strip() or None
        cfg.ca_cert = data.get("ca_cert")
        if "timeout" in data:
            cfg.timeout_s = wait_setting(data["timeout"], f"{file}: timeout")
        for entry in data.get("servers", []):
            if isinstance(entry, str):
                cfg.servers.append(ServerRef(normalize_url(entry), None))
            elif isinstance(entry, dict) and "url" in entry:
                cfg.servers.append(ServerRef(normalize_url(entry["url"]), entry.get("token")))
            else:
                raise ConfigError(
                    f"{file}: servers entry {entry!r} is neither a string nor {{url = ...}}",
                    "see deploy/client.toml",
                )
    elif chosen:
        raise ConfigError(
            f"config file {file} not found", "create it (see docs/pool.md) or drop --config/GPUPOOL_CONFIG"
        )
    if cluster:  # --cluster: the servers come from the cluster (plus --server, if given too)
        cfg.cluster = check_cluster_url(cluster)
        cfg.servers = []
    if servers:
        cfg.servers = [ServerRef(normalize_url(u), None) for s in servers for u in s.split(",") if u.strip()]
    if token or os.environ.get("GPUPOOL_TOKEN"):
        cfg.token = (token or os.environ.get("GPUPOOL_TOKEN") or "").strip() or None
    return cfg
