"""The shaped link of tests/netem_link.py built through netlink (pyroute2), for hosts without
iproute2 (the lent GPU machines have neither `ip` nor `tc`, but their kernel has veth, network
namespaces and tbf). The same namespaces, addresses, loopback pair and shaping as the `ip`/`tc`
commands there; programs run inside a namespace through `nsenter`."""

from __future__ import annotations

import contextlib
import subprocess

NUD_PERMANENT = 0x80
RT_TABLE_LOCAL = 255


def available() -> str | None:
    """Why netlink cannot build the link here (None: it can)."""
    try:
        import pyroute2  # noqa: F401
    except ImportError:
        return "neither iproute2 (`ip`, `tc`) nor pyroute2 (pip install pyroute2)"
    if subprocess.run(["nsenter", "--version"], capture_output=True).returncode != 0:
        return "no `nsenter` (util-linux)"
    return None


def prefix(ns: str) -> list[str]:
    return ["nsenter", f"--net=/var/run/netns/{ns}"]


def add_namespace(ns: str) -> None:
    from pyroute2 import netns

    netns.create(ns)


def delete_namespace(ns: str) -> None:
    from pyroute2 import netns

    with contextlib.suppress(OSError):
        netns.remove(ns)


def has_qdisc(kind: str) -> bool:
    """Whether the kernel has `kind` (tried on lo of a throw-away namespace)."""
    import uuid

    probe = f"gpnetem-probe-{uuid.uuid4().hex[:8]}"
    add_namespace(probe)
    try:
        return _in(probe, "qdisc", {"dev": "lo", "kind": kind}, check=False) == "ok"
    finally:
        delete_namespace(probe)


def build(link) -> None:
    """The veth pair between `link.worker_ns` and `link.client_ns` (both made already), addressed,
    shaped and with the loopback pair routed over it, as NetemLink._create does with iproute2. Each
    step runs inside its namespace (a Python of its own under nsenter, pyroute2's IPRoute there)."""
    o = link.options
    vw, vc = link._veth
    _in(link.worker_ns, "veth", {"dev": vw, "peer": vc, "peer_ns": link.client_ns})
    sides = (
        (link.worker_ns, vw, link.worker_ip, link.worker_loopback_ip, link.client_loopback_ip),
        (link.client_ns, vc, link.client_ip, link.client_loopback_ip, link.worker_loopback_ip),
    )
    shaper = (
        {"kind": "netem", "delay": _micros(o.delay), "rate": o.rate, "limit": o.limit}
        if link.shaper[0] == "netem"
        else {"kind": "tbf", "rate": o.rate, "burst": o.tbf_burst, "limit": o.tbf_limit}
    )
    macs = {
        ns: _in(ns, "side", {"dev": dev, "mtu": o.mtu, "ip": ip, "shaper": shaper})
        for ns, dev, ip, _, _ in sides
    }
    for ns, dev, _, mine, theirs in sides:
        peer_ns = link.client_ns if ns == link.worker_ns else link.worker_ns
        settings = [f"net.ipv4.conf.{c}.{key}={value}" for c in ("all", dev, "lo")
                    for key, value in (("route_localnet", 1), ("rp_filter", 0))]  # fmt: skip
        link.sh(ns, "sysctl", "-qw", *settings)
        _in(ns, "loopback_pair", {"dev": dev, "mine": mine, "theirs": theirs, "mac": macs[peer_ns]})


def qdisc_stats(ns: str, dev: str) -> str:
    """The qdisc's counters in the words `tc -s qdisc show` uses (Sent N bytes M pkt (dropped ...))."""
    return _in(ns, "stats", {"dev": dev})


def _in(ns: str, action: str, args: dict, check: bool = True) -> str:
    import json
    import sys

    proc = subprocess.run(
        [*prefix(ns), sys.executable, __file__, action, json.dumps(args)], capture_output=True, text=True
    )
    if check and proc.returncode != 0:
        raise RuntimeError(f"netlink {action} in {ns}: {proc.stderr.strip()[-500:]}")
    return proc.stdout.strip()


def _main(action: str, args: dict) -> str:
    """One step, inside the namespace this process was started in."""
    from pyroute2 import IPRoute

    with IPRoute() as ipr:

        def index(name: str) -> int:
            return ipr.link_lookup(ifname=name)[0]

        if action == "qdisc":
            try:
                extra = (
                    {"delay": 1}
                    if args["kind"] == "netem"
                    else {"rate": "1gbit", "burst": 65536, "limit": 65536}
                )
                ipr.tc("add", args["kind"], index(args["dev"]), **extra)
                return "ok"
            except Exception:
                return "no"
        if action == "veth":
            ipr.link(
                "add",
                ifname=args["dev"],
                kind="veth",
                peer={"ifname": args["peer"], "net_ns_fd": args["peer_ns"]},
            )
            return ""
        if action == "side":
            ipr.link("set", index=index("lo"), state="up")
            i = index(args["dev"])
            ipr.link("set", index=i, mtu=args["mtu"], state="up")
            ipr.addr("add", index=i, address=args["ip"], prefixlen=30)
            shaper = dict(args["shaper"])
            ipr.tc("add", shaper.pop("kind"), i, **shaper)
            return ipr.get_links(i)[0].get_attr("IFLA_ADDRESS")
        if action == "loopback_pair":
            # This side's own 127.77.0.x, the other's routed over the veth; only 127.0.0.1 stays on lo
            # (the kernel's 127.0.0.0/8 route would swallow the peer's address).
            lo, i = index("lo"), index(args["dev"])
            local = {"table": RT_TABLE_LOCAL, "type": "local", "scope": "host", "oif": lo}
            ipr.route("del", dst="127.0.0.0", dst_len=8, proto="kernel", **local)
            ipr.route("replace", dst="127.0.0.1", dst_len=32, **local)
            ipr.addr("add", index=i, address=args["mine"], prefixlen=32)
            ipr.route("add", dst=f"{args['theirs']}/32", oif=i, prefsrc=args["mine"])
            ipr.neigh("replace", dst=args["theirs"], lladdr=args["mac"], ifindex=i, state=NUD_PERMANENT)
            return ""
        if action == "stats":
            for q in ipr.get_qdiscs(index=index(args["dev"])):
                stats = q.get_attr("TCA_STATS") or {}
                return (
                    f"qdisc {q.get_attr('TCA_KIND')} Sent {stats.get('bytes', 0)} bytes {stats.get('packets', 0)} "
                    f"pkt (dropped {stats.get('drop', 0)}, overlimits {stats.get('overlimits', 0)})"
                )
            return ""
    raise SystemExit(f"unknown step {action}")


def _micros(delay: str) -> int:
    """tc's time units (20us, 1ms, 0.5ms) in microseconds."""
    for unit, scale in (("us", 1), ("ms", 1000), ("s", 1_000_000)):
        if delay.endswith(unit):
            return int(float(delay[: -len(unit)]) * scale)
    return int(delay)


if __name__ == "__main__":
    import json
    import sys

    print(_main(sys.argv[1], json.loads(sys.argv[2])))
