"""Request filters on the keys Bitfusion users know: ``device.name=H100``, ``device.phy-memory>=40000``.

A filter is ``KEY OP VALUE`` with OP one of ``= != >= <= > <``. Server keys decide whether this
server may serve the request at all; device keys pick which of its GPUs may hold a partition.

How values compare, by key:
- names (``server.hostname``, ``device.name``): ``=`` is a case-insensitive *substring* match, so
  ``device.name=H100`` matches "NVIDIA H100 80GB HBM3" (users type models, NVML reports product names);
  ordering operators compare the strings.
- versions (``server.cuda-version``, ``server.driver-version``): component-wise numbers, 12.10 > 12.4.
- numbers (``device.id``: the GPU index; ``device.phy-memory``: total memory in MiB).
- ``server.addr``: an address, or a network in CIDR form (``server.addr=10.0.0.0/24``).
"""

from __future__ import annotations

import ipaddress
import operator
import re
from dataclasses import dataclass

from server._errors import BadRequest
from server._inventory import MIB, Gpu, Inventory

SERVER_KEYS = ("server.addr", "server.hostname", "server.cuda-version", "server.driver-version")
DEVICE_KEYS = ("device.id", "device.name", "device.phy-memory")
KEYS = SERVER_KEYS + DEVICE_KEYS

_OPS = {
    "=": operator.eq,
    "==": operator.eq,
    "!=": operator.ne,
    ">=": operator.ge,
    "<=": operator.le,
    ">": operator.gt,
    "<": operator.lt,
}
_FILTER = re.compile(r"^\s*([a-z][a-z.\-]*)\s*(==|!=|>=|<=|=|>|<)\s*(.+?)\s*$")
_KIND = {
    "server.addr": "addr",
    "server.hostname": "name",
    "device.name": "name",
    "server.cuda-version": "version",
    "server.driver-version": "version",
    "device.id": "int",
    "device.phy-memory": "int",
}


@dataclass(frozen=True)
class Filter:
    key: str
    op: str
    value: str

    def __str__(self) -> str:
        return f"{self.key}{self.op}{self.value}"


def _version(text: str) -> tuple[int, ...]:
    parts = re.findall(r"\d+", text)
    if not parts:
        raise ValueError(text)
    return tuple(int(p) for p in parts)


def parse_filter(text: str) -> Filter:
    if not isinstance(text, str):
        raise BadRequest(f"filter {text!r} is not a string", "write filters as KEY=VALUE strings")
    m = _FILTER.match(text)
    if not m:
        raise BadRequest(
            f"cannot read filter {text!r}",
            "write KEY OP VALUE with OP one of = != >= <= > <, e.g. device.phy-memory>=40000",
        )
    key, op, value = m.groups()
    if key not in _KIND:
        raise BadRequest(f"unknown filter key {key!r}", "known keys: " + ", ".join(KEYS))
    kind = _KIND[key]
    try:
        if kind == "int":
            int(value)
        elif kind == "version":
            _version(value)
        elif kind == "addr":
            ipaddress.ip_network(value, strict=False)
    except ValueError:
        what = {"int": "a whole number", "version": "a version like 12.4", "addr": "an IP address or CIDR"}
        raise BadRequest(
            f"filter {text!r}: {value!r} is not {what[kind]}", f"{key} takes {what[kind]}"
        ) from None
    if kind == "addr" and op not in ("=", "==", "!="):
        raise BadRequest(f"filter {text!r}: {key} supports only = and !=", "e.g. server.addr=10.0.0.0/24")
    return Filter(key, op, value)


def parse_filters(texts: list[str]) -> list[Filter]:
    return [parse_filter(t) for t in texts]


def _compare(kind: str, op: str, actual, wanted: str) -> bool:
    if actual is None:
        return op == "!="
    if kind == "name":
        a, w = str(actual).lower(), wanted.lower()
        if op in ("=", "=="):
            return w in a
        if op == "!=":
            return w not in a
        return _OPS[op](a, w)
    if kind == "int":
        return _OPS[op](int(actual), int(wanted))
    if kind == "version":
        try:
            return _OPS[op](_version(str(actual)), _version(wanted))
        except ValueError:
            return False
    # addr
    try:
        inside = ipaddress.ip_address(str(actual)) in ipaddress.ip_network(wanted, strict=False)
    except ValueError:
        inside = False
    return inside if op in ("=", "==") else not inside


def server_matches(inv: Inventory, filters: list[Filter]) -> Filter | None:
    """The first server filter this server fails, or None when it passes them all."""
    values = {
        "server.addr": inv.addr,
        "server.hostname": inv.hostname,
        "server.cuda-version": inv.cuda_version,
        "server.driver-version": inv.driver_version,
    }
    for f in filters:
        if f.key in values and not _compare(_KIND[f.key], f.op, values[f.key], f.value):
            return f
    return None


def gpu_matches(gpu: Gpu, filters: list[Filter]) -> bool:
    values = {
        "device.id": gpu.index,
        "device.name": gpu.name,
        "device.phy-memory": gpu.mem_total_bytes // MIB,
    }
    return all(_compare(_KIND[f.key], f.op, values[f.key], f.value) for f in filters if f.key in values)
