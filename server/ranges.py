"""The range of every number a client or an admin gives the pool, written once.

One table serves every door a value comes in by: the API's request structs (``server.api``) take
their bounds from it, the server's config file and ``gpupool-server client set`` are checked against
it, a value read back from the stored policy is ignored when it falls outside it (one written by an
older version, or by hand), and ``gpuattach`` checks a request against it before asking any server
(so this module is standard library only). docs/pool.md ("Ranges") lists the same rows.

Why these floors: a partition is at least 1/64 of its GPU (``MIN_FRACTION``): a GPU is cut into at
most 64 pieces, each big enough to hold a CUDA context (~0.5 GiB) on an 80 GiB card, and a lease's
usage never rounds to zero. Durations that end leases (TTL, idle timeout, maximum length) are at
least a second: below that every lease dies before its first heartbeat.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from collector.durations import format_duration

MIN_FRACTION = 1 / 64  # the smallest partition, as a share of its GPU's memory
MAX_SECONDS = 100 * 365 * 86400  # a duration past a century is a typo, and past time_t's range a crash
MAX_GPUS_PER_REQUEST = 1024
MAX_MIB = 1 << 30  # a partition of a PiB: above any GPU made, below any overflow
MAX_LIMIT_GPUS = 100_000  # a client limit above the GPUs of any fleet is "no limit" in disguise
DEFAULT_MAX_LEASES_PER_CLIENT = 32
DEFAULT_MAX_WORKERS_PER_CLIENT = 8  # a remote lease's worker costs ~45 MiB of host memory and a CUDA context


@dataclass(frozen=True)
class Range:
    """``lo``-``hi`` inclusive; ``off`` is one more value below ``lo`` that means "off" (0: never)."""

    lo: float
    hi: float
    unit: str = ""  # "s" for durations (shown as 1s, 100y), else a word after the number
    off: float | None = None
    whole: bool = False

    def problem(self, value: object) -> str | None:
        """Why ``value`` is not in this range, in words (None: it is)."""
        if isinstance(value, bool) or not isinstance(value, int | float):
            return f"{value!r} is not a number"
        if self.whole and not (isinstance(value, int) or (math.isfinite(value) and value == int(value))):
            return f"{value:g} is not a whole number"
        if self.off is not None and value == self.off:
            return None
        if not (math.isfinite(value) and self.lo <= value <= self.hi):
            shown = str(value) if isinstance(value, int) else repr(value).removesuffix(".0")
            return f"{shown} is out of range ({self.text()})"
        return None

    def text(self) -> str:
        """The range as a person reads it: ``1s-100y, or 0 (off)``, ``0-100000 GPUs``."""
        span = f"{self._show(self.lo)}-{self._show(self.hi)}"
        if self.unit and self.unit != "s":
            span += f" {self.unit}"
        return span + (f", or {self.off:g} (off)" if self.off is not None else "")

    def _show(self, x: float) -> str:
        return format_duration(x, "exact") if self.unit == "s" else f"{x:.15g}"


LIMIT = Range(0, MAX_LIMIT_GPUS, "GPUs")
IDLE_TIMEOUT = Range(1, MAX_SECONDS, "s", off=0)
TTL = Range(1, 86400, "s")

# What a lease request may ask for (server.api.LeaseRequest, gpuattach's options).
REQUEST = {
    "n": Range(1, MAX_GPUS_PER_REQUEST, whole=True),
    "fraction": Range(MIN_FRACTION, 1),
    "mem_mib": Range(1, MAX_MIB, "MiB", whole=True),
    "sm_share": Range(0.01, 1),  # MPS takes whole percents of the SMs
    "ttl_s": TTL,
}

# Policy an admin sets (PUT /v1/admin/policy, [policy] of server.toml, the serve options).
POLICY = {
    "default_limit": LIMIT,
    "default_idle_timeout_s": IDLE_TIMEOUT,
    "max_lease_s": Range(1, MAX_SECONDS, "s", off=0),
    "lease_ttl_s": TTL,
    "max_leases_per_client": Range(1, 10_000, whole=True),
    "max_workers_per_client": Range(0, 1024, whole=True),
}

# A client's own settings (PUT /v1/admin/clients/NAME, gpupool-server client set, [clients.NAME]).
CLIENT = {"limit": LIMIT, "idle_timeout_s": IDLE_TIMEOUT}

# A token's lifetime (POST /v1/admin/tokens, gpupool-server token create/import --expires).
TOKEN = {"expires_in_s": Range(1, MAX_SECONDS, "s")}

# The server's own timings, only in server.toml's [policy] and [server] sections.
SERVER = {
    "max_ttl_s": TTL,
    "reap_interval_s": Range(0.05, 3600, "s"),
    "activity_window_s": Range(0.1, 3600, "s"),
    "sample_interval_s": Range(0.1, 3600, "s"),
    "telemetry_flush_s": Range(0.1, 86400, "s"),
    "ended_retention_s": Range(0, MAX_SECONDS, "s"),
    "rollup_every_s": Range(1, MAX_SECONDS, "s", off=0),
    "keep_raw_s": Range(0, MAX_SECONDS, "s"),
    "cluster_ttl_s": Range(1, 3600, "s"),
}


def problem(table: dict[str, Range], name: str, value: object) -> str | None:
    """Why ``value`` cannot be ``name`` of ``table`` ("name 5e-324 is out of range (1s-1d)"), or None.
    None (unset: the next layer applies) is always allowed."""
    if value is None:
        return None
    why = table[name].problem(value)
    return f"{name} {why}" if why else None


# What each value is, for the table in docs/pool.md ("Ranges"), which ``markdown()`` writes.
MEANING = {
    "n": "GPUs of one lease (`-n`), each a separate GPU of one server",
    "fraction": "partition as a share of each GPU's memory (`-p`); the smallest partition is 1/64",
    "mem_mib": "partition in MiB (`-m`); reserves at least 1/64 of the GPU it lands on",
    "sm_share": "share of each GPU's SMs (`--sm-share`, with MPS)",
    "ttl_s": "heartbeat TTL a client asks for (at most the server's `max_ttl`)",
    "default_limit": "GPUs (sum of fractions) a client without its own limit holds; default none",
    "default_idle_timeout_s": "idle time before a lease is reclaimed; default none (0: never)",
    "max_lease_s": "hard maximum lease length; default none (0: none)",
    "lease_ttl_s": "heartbeat TTL of leases; default 30s",
    "max_leases_per_client": "active leases one client holds on a server; default 32",
    "max_workers_per_client": "remote leases (a worker process each) one client runs on a server; default 8",
    "limit": "a client's own GPU limit (`client set --limit`, `[clients.NAME] limit`)",
    "idle_timeout_s": "a client's own idle timeout (0: never reclaimed)",
    "max_ttl_s": "longest TTL a client may ask for; default 1h",
    "reap_interval_s": "how often leases are checked for expiry and idleness; default 1s",
    "activity_window_s": "window of GPU activity an idle check reads; default 5s",
    "sample_interval_s": "GPU samples to telemetry; default 5s",
    "telemetry_flush_s": "telemetry written this often; default 10s",
    "ended_retention_s": "ended leases stay queryable this long; default 30d",
    "rollup_every_s": "telemetry rollups brought up to date this often; default 1h (0: never)",
    "keep_raw_s": "raw GPU samples older than this deleted once rolled up; default kept",
    "cluster_ttl_s": "cluster membership TTL; default 10s",
    "expires_in_s": "a token's lifetime (`--expires`); default: never expires",
}
TABLES = {
    "lease request (API, `gpuattach`)": REQUEST,
    "policy (`PUT /v1/admin/policy`, `[policy]`)": POLICY,
    "client (`PUT /v1/admin/clients/NAME`, `client set`, `[clients.NAME]`)": CLIENT,
    "token (`POST /v1/admin/tokens`, `token create --expires`)": TOKEN,
    "server timings (`server.toml` only)": SERVER,
}


def markdown() -> str:
    """The ranges as the Markdown table docs/pool.md carries (a test checks that it is current)."""
    lines = ["| field | range | meaning |", "| --- | --- | --- |"]
    for where, table in TABLES.items():
        lines.append(f"| *{where}* | | |")
        for name, r in table.items():
            lines.append(f"| `{name}` | {r.text()} | {MEANING[name]} |")
    return "\n".join(lines)


if __name__ == "__main__":  # python -m server.ranges: the table for docs/pool.md
    print(markdown())
