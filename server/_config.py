"""Server configuration: a TOML file (``--config``), then command-line options on top.

Policy values (limits, idle timeouts, lease lengths) have three layers, strongest first: what an
admin set through the API (stored in the server's database, so it survives restarts), the config
file, built-in defaults. An admin can therefore change policy live without editing files, and a
fresh state directory starts from the file.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from collector import durations
from server import ranges
from server._errors import BadRequest

DEFAULT_PORT = 56001  # Bitfusion's server port; any free port works


@dataclass
class ClientPolicy:
    limit: float | None = None
    idle_timeout_s: float | None = None


@dataclass
class ServerConfig:
    host: str = "0.0.0.0"
    port: int = DEFAULT_PORT
    advertise_addr: str | None = None  # what server.addr filters see; default: the outward interface
    state_dir: Path = Path("/var/lib/gpupool")
    telemetry_dir: Path | str | None = None  # a directory, or an s3://BUCKET/PREFIX location
    simulate_gpus: str | None = None
    mps: bool = False
    mps_pipe_dir: Path | None = None  # join an MPS daemon that is already running there
    tls_cert: Path | None = None
    tls_key: Path | None = None
    # cluster mode: shared state on etcd (etcd://h1:2379,h2:2379,h3:2379); None: the embedded store
    cluster: str | None = None
    cluster_name: str | None = None  # this server's member name (default hostname:port)
    cluster_ttl_s: float = 10.0  # membership TTL: a dead server's leases leave the cluster this fast
    # policy (the config-file layer)
    lease_ttl_s: float = 30.0
    max_ttl_s: float = 3600.0
    default_limit: float | None = None
    default_idle_timeout_s: float | None = None
    max_lease_s: float | None = None
    max_leases_per_client: int = ranges.DEFAULT_MAX_LEASES_PER_CLIENT
    max_workers_per_client: int = ranges.DEFAULT_MAX_WORKERS_PER_CLIENT
    clients: dict[str, ClientPolicy] = field(default_factory=dict)
    # loops
    reap_interval_s: float = 1.0
    activity_window_s: float = 5.0
    sample_interval_s: float = 5.0
    telemetry_flush_s: float = 10.0
    ended_retention_s: float = 30 * 86400  # ended leases stay queryable this long (telemetry keeps all)
    rollup_every_s: float = 3600.0  # the GPU samples' minute and hour rollups brought up to date (0: never)
    keep_raw_s: float | None = None  # raw gpu_samples days older than this go once rolled up (None: kept)


def load_config(path: Path | None) -> ServerConfig:
    cfg = ServerConfig()
    if path is None:
        return cfg
    try:
        data = tomllib.loads(Path(path).read_text())
    except FileNotFoundError:
        raise BadRequest(f"config file {path} not found", "pass --config PATH of an existing file") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise BadRequest(f"config file {path} is not valid TOML: {exc}", "see deploy/server.toml") from None
    try:
        _apply(cfg, data, path)
    except (ValueError, TypeError, AttributeError) as exc:
        raise BadRequest(
            f"config file {path}: a value has the wrong type ({exc})", "see deploy/server.toml"
        ) from None
    check_ranges(cfg, f"config file {path}")
    return cfg


def check_ranges(cfg: ServerConfig, where: str) -> None:
    """Every policy value, timing and client setting of ``cfg`` within its range (``server.ranges``),
    else one BadRequest naming it as the config file does (``lease_ttl``, not ``lease_ttl_s``)."""
    rows = [(ranges.POLICY, key, getattr(cfg, key), "policy.") for key in ranges.POLICY]
    rows += [(ranges.SERVER, key, getattr(cfg, key), "") for key in ranges.SERVER]
    for name, c in cfg.clients.items():
        rows += [(ranges.CLIENT, "limit", c.limit, f"clients.{name}."),
                 (ranges.CLIENT, "idle_timeout_s", c.idle_timeout_s, f"clients.{name}.")]  # fmt: skip
    for table, key, value, section in rows:
        if why := ranges.problem(table, key, value):
            shown = key.removesuffix("_s") if table[key].unit == "s" else key
            raise BadRequest(
                f"{where}: {section}{shown} {why.removeprefix(key + ' ')}",
                "see the ranges in docs/pool.md (Ranges) and deploy/server.toml",
            )


def telemetry_location(value: str) -> Path | str:
    """``--telemetry``/``telemetry =``: a directory, or ``s3://BUCKET/PREFIX`` kept as written (the
    telemetry writer checks it, ``collector.location``)."""
    return str(value) if str(value).startswith("s3://") else Path(value)


def _apply(cfg: ServerConfig, data: dict, path: Path) -> None:
    known_sections = {"server", "policy", "clients"}
    unknown = set(data) - known_sections
    if unknown:
        raise BadRequest(
            f"config file {path}: unknown section(s) {sorted(unknown)}", "known: server, policy, clients"
        )
    s = data.get("server", {})
    paths = {"state_dir", "telemetry", "mps_pipe_dir", "tls_cert", "tls_key"}
    for key, value in s.items():
        if key in paths:
            if key == "telemetry":
                cfg.telemetry_dir = telemetry_location(value) if value else None
            else:
                setattr(cfg, key, Path(value) if value else None)
        elif key == "cluster_ttl":
            cfg.cluster_ttl_s = durations.setting(value, "server.cluster_ttl", BadRequest)
        elif key in ("host", "advertise_addr", "simulate_gpus", "cluster", "cluster_name"):
            setattr(cfg, key, str(value))
        elif key == "port":
            cfg.port = int(value)
            if not 0 <= cfg.port <= 65535:
                raise BadRequest(
                    f"config file {path}: server.port {cfg.port} is not 0-65535", "see deploy/server.toml"
                )
        elif key == "mps":
            cfg.mps = bool(value)
        else:
            raise BadRequest(f"config file {path}: unknown key server.{key}", "see deploy/server.toml")
    p = data.get("policy", {})
    seconds = {
        "lease_ttl": "lease_ttl_s",
        "max_ttl": "max_ttl_s",
        "default_idle_timeout": "default_idle_timeout_s",
        "max_lease": "max_lease_s",
        "reap_interval": "reap_interval_s",
        "activity_window": "activity_window_s",
        "sample_interval": "sample_interval_s",
        "telemetry_flush": "telemetry_flush_s",
        "ended_retention": "ended_retention_s",
        "rollup_every": "rollup_every_s",
        "keep_raw": "keep_raw_s",
    }
    for key, value in p.items():
        if key in seconds:
            setattr(cfg, seconds[key], durations.setting(value, f"policy.{key}", BadRequest))
        elif key == "default_limit":
            cfg.default_limit = float(value)
        elif key in ("max_leases_per_client", "max_workers_per_client"):
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"policy.{key} must be a whole number, not {value!r}")
            setattr(cfg, key, value)
        else:
            raise BadRequest(f"config file {path}: unknown key policy.{key}", "see deploy/server.toml")
    for name, c in data.get("clients", {}).items():
        cfg.clients[name] = ClientPolicy(
            limit=float(c["limit"]) if "limit" in c else None,
            idle_timeout_s=durations.setting(c["idle_timeout"], f"clients.{name}.idle_timeout", BadRequest)
            if "idle_timeout" in c
            else None,
        )
