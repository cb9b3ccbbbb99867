"""``gpupool-server``: serve this host's GPUs to the pool, and manage its tokens.

    gpupool-server [serve] [--config server.toml] [--simulate-gpus 4xH100-80GB] [--mps] ...
    gpupool-server token create CLIENT [--admin] [--expires 365d]
    gpupool-server token list | token revoke TOKEN_ID
    gpupool-server --cluster etcd://h1:2379,h2:2379,h3:2379 ...     (cluster mode: shared state on etcd)
    gpupool-server cluster migrate --state-dir DIR --cluster etcd://... | cluster members --cluster ...
    gpupool-server lease migrate LEASE --to GPU | drain [SERVER] [--gpu N] [--wait 2h] | undrain [SERVER]
    gpupool-server webhook --image IMAGE --pool-server gpu1:56001 --tls-cert C --tls-key K   (Kubernetes)

Heavy imports (aiohttp, msgspec, the collector) load only when a command needs them.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from collector import durations
from collector.argtypes import ranged
from collector.errors import report
from collector.words import plural
from server.ranges import CLIENT, MAX_LIMIT_GPUS, POLICY

SUBCOMMANDS = ("serve", "token", "client", "cluster", "lease", "drain", "undrain", "webhook")
EXIT_USAGE = 2


class _Parser(argparse.ArgumentParser):
    """Bad usage is one line on stderr and exit 2, like every other error a user can cause."""

    def error(self, message: str):
        sys.exit(report("gpupool-server", message, f"see {self.prog} --help", EXIT_USAGE))


def _telemetry_arg(text: str):
    from server._config import telemetry_location

    return telemetry_location(text)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="gpupool-server",
        description="The GPU server of the pool: inventory, leases of GPU partitions, limits, tokens, idle "
        "reclaim, HTTP/JSON API (OpenAPI at /openapi.json). See docs/pool.md.",
    )
    sub = p.add_subparsers(dest="command", metavar="{serve,token,client,cluster,lease,drain,undrain,webhook}")
    s = sub.add_parser("serve", help="serve leases (the default command)")
    s.add_argument("--config", type=Path, help="TOML config file (see deploy/server.toml)")
    s.add_argument("--host", help="address to bind (default 0.0.0.0)")
    s.add_argument(
        "--port",
        type=ranged(int, 0, 65535, "a port number"),
        help="port to bind, 0 for any free one (default 56001)",
    )
    s.add_argument(
        "--advertise-addr", help="address clients reach this server at (what server.addr filters match)"
    )
    s.add_argument(
        "--state-dir",
        type=Path,
        help="where leases, policy and tokens are stored (default /var/lib/gpupool); one server per "
        "directory (a second is refused with the first one's PID); on a full disk the server serves "
        "read-only (docs/pool.md, A full disk)",
    )
    s.add_argument(
        "--simulate-gpus",
        metavar="SPEC",
        help="serve a labelled simulated fleet, e.g. 4xH100-80GB,2xA100-40GB (control plane only)",
    )
    s.add_argument(
        "--mps",
        action="store_true",
        default=None,
        help="enforce partitions with CUDA MPS (start or join the MPS daemon)",
    )
    s.add_argument(
        "--mps-pipe-dir", type=Path, help="join the MPS daemon already running with this pipe directory"
    )
    s.add_argument(
        "--telemetry",
        type=_telemetry_arg,
        metavar="DIR|s3://BUCKET/PREFIX",
        help="telemetry directory (or S3-compatible bucket) for pool events and this host's GPU samples",
    )
    s.add_argument("--tls-cert", type=Path, help="serve HTTPS with this certificate (PEM)")
    s.add_argument("--tls-key", type=Path, help="private key of --tls-cert (PEM)")
    s.add_argument(
        "--lease-ttl",
        metavar="DURATION",
        help=f"heartbeat TTL of leases, {POLICY['lease_ttl_s'].text()} (default 30s)",
    )
    s.add_argument(
        "--default-limit",
        type=ranged(float, 0, MAX_LIMIT_GPUS, "a GPU limit"),
        metavar="GPUS",
        help=f"GPU limit (sum of fractions) of clients without their own, {POLICY['default_limit'].text()}",
    )
    s.add_argument(
        "--idle-timeout",
        metavar="DURATION",
        help="default idle timeout before a lease is reclaimed (e.g. 30m), "
        f"{POLICY['default_idle_timeout_s'].text()}",
    )
    s.add_argument(
        "--max-lease",
        metavar="DURATION",
        help=f"maximum lease length (e.g. 24h), {POLICY['max_lease_s'].text()}; per-client caps on leases "
        "and workers: [policy] of --config (docs/pool.md, Ranges)",
    )
    s.add_argument(
        "--cluster",
        metavar="etcd://H:P,...",
        help="cluster mode: tokens, policy, limits and membership on this etcd cluster (docs/pool.md)",
    )
    s.add_argument("--cluster-name", help="this server's member name in the cluster (default hostname:port)")
    s.add_argument(
        "--cluster-ttl",
        metavar="DURATION",
        help="membership TTL: how soon a dead server's leases leave the cluster (default 10s)",
    )
    s.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])

    common = _Parser(add_help=False)
    common.add_argument("--config", type=Path, help="TOML config file (for its state_dir)")
    common.add_argument(
        "--state-dir", type=Path, help="the server's state directory (default /var/lib/gpupool)"
    )
    common.add_argument(
        "--cluster", metavar="etcd://H:P,...", help="act on the cluster's shared state in etcd instead"
    )
    t = sub.add_parser(
        "token", help="create, list or revoke client tokens (works with the server running or not)"
    )
    tsub = t.add_subparsers(dest="token_command", metavar="{create,import,list,revoke}", required=True)
    tc = tsub.add_parser(
        "create", parents=[common], help="print a new token for CLIENT (only its hash is stored)"
    )
    tc.add_argument(
        "client", help="client name the token authenticates (limits and idle timeouts are per client)"
    )
    tc.add_argument(
        "--admin", action="store_true", help="an admin token (admin API: clients, policy, tokens)"
    )
    tc.add_argument(
        "--expires", metavar="DURATION", help="lifetime, e.g. 365d, 12h; 1s-100y (default: never)"
    )
    ti = tsub.add_parser(
        "import",
        parents=[common],
        help="store a token made on another server (read from stdin), so one token works on all",
    )
    ti.add_argument("client")
    ti.add_argument("--admin", action="store_true", help="an admin token")
    ti.add_argument("--expires", metavar="DURATION", help="lifetime from now, 1s-100y (default: never)")
    tsub.add_parser("list", parents=[common], help="list tokens (ids, clients, expiry; never the secrets)")
    tr = tsub.add_parser("revoke", parents=[common], help="revoke a token by its id")
    tr.add_argument("token_id")

    c = sub.add_parser(
        "client", help="list clients, set a client's GPU limit and idle timeout (live, stored)"
    )
    csub = c.add_subparsers(dest="client_command", metavar="{list,set}", required=True)
    csub.add_parser("list", parents=[common], help="clients with their limit, idle timeout and usage")
    cs = csub.add_parser(
        "set", parents=[common], help="set a client's own limit / idle timeout ('default' clears it)"
    )
    cs.add_argument("client")
    cs.add_argument(
        "--limit",
        metavar="GPUS|default",
        help=f"GPU limit, a sum of fractions (e.g. 2.5), {CLIENT['limit'].text()}",
    )
    cs.add_argument(
        "--idle-timeout",
        metavar="DURATION|default",
        help=f"idle timeout (e.g. 30m; 0 = never reclaim), {CLIENT['idle_timeout_s'].text()}",
    )
    k = sub.add_parser("cluster", help="cluster mode: move to etcd, list the cluster's servers")
    ksub = k.add_subparsers(dest="cluster_command", metavar="{migrate,members}", required=True)
    km = ksub.add_parser(
        "migrate",
        parents=[common],
        help="copy tokens, clients, policy and live leases from the embedded store into etcd",
    )
    km.add_argument(
        "--name",
        help="the member name the server will run under (default hostname:port of its config); "
        "its live leases are attached to it",
    )
    ksub.add_parser("members", parents=[common], help="the servers registered in the cluster now")
    _moving_parsers(sub)
    _webhook_parser(sub)
    return p


def _moving_parsers(sub) -> None:
    lp = sub.add_parser("lease", help="act on a running server's leases (admin token)")
    lsub = lp.add_subparsers(dest="lease_command", metavar="{migrate}", required=True)
    m = lsub.add_parser(
        "migrate",
        help="move a running remote lease to another GPU or server, live (docs/remote.md, Migration)",
        description="Move a running remote lease's partition to GPU --to of the same server while its program "
        "runs: the worker holds the lease's calls, copies its device memory to the same addresses on the "
        "target and resumes. With --to SERVER (another gpupool-server, which takes the same admin token) the "
        "whole lease moves there: the target admits it, the worker sends its memory, objects and processes' "
        "state (the memory over GPUPOOL_MIGRATE_STRIPES connections at once, from the lease's server's "
        "environment: 1 to 16, default 1), and each process reconnects there at its next call (docs/remote.md, "
        "Between servers). What "
        "cannot move (an MPS lease, a stream capture in flight; to another server also shared-memory copies "
        "and page-locked memory shared on one host, NCCL, a graph's host node, ...) is refused with the reason, and a "
        "failure leaves the lease running where it was. Prints the pause.",
    )
    m.add_argument("lease", help="the lease id (lease-...)")
    m.add_argument("--to", required=True, metavar="GPU|SERVER",
                   help="the target GPU's index on the lease's server (GET /v1/gpus), or another server: "
                        "host:port, URL, or a member name of --cluster")  # fmt: skip
    m.add_argument("--cluster", metavar="etcd://...", help="the cluster --to SERVER is a member of (names it "
                   "as gpupool-server cluster members lists)")  # fmt: skip
    m.add_argument("--partition", type=ranged(int, 0, 1023, "a partition"), default=0,
                   help="which of the lease's partitions moves, from 0 (default 0)")  # fmt: skip
    _admin_options(m)
    d = sub.add_parser(
        "drain",
        help="drain a server (no new leases) or one of its GPUs (its remote leases move to other GPUs, live)",
        description="Drain a running server: it grants no new lease from now on (until --undo or a restart of "
        "the server; clients asking it are told it is draining and take another server), then each remote lease "
        "on it moves, live, to another server of the pool with room: the --move-to servers in the order given, "
        "else the other members of --cluster (without either there is nowhere to move to: the leases stay, as "
        "with --stay). Each lease that cannot move (a local lease, what a move does not carry yet) stays, listed "
        "with why, until its program ends. With --gpu N only that GPU drains: no new lease goes to it and each remote "
        "lease on it moves, live, to another GPU of the same model with room (see gpupool-server lease "
        "migrate). Prints what moved and what stayed, with the reason; exit 1 if a lease stayed (with --wait: if "
        "one still runs when the wait ends).",
    )
    _drain_target_options(d, "drain only this GPU (its index)")
    d.add_argument(
        "--undo", action="store_true", help="end the draining: the server or GPU takes new leases again"
    )
    d.add_argument("--wait", type=durations.argument(), metavar="DURATION",
                   help="after draining the server, wait up to DURATION (e.g. 30m) until no lease runs on it, "
                        "saying on stderr which still do as they end; exit 1 if some still run then")  # fmt: skip
    d.add_argument("--move", action="store_true",
                   help="move each remote lease, live, to another server (the default with --cluster or "
                        "--move-to; without either it needs --move-to); each lease that cannot move stays with "
                        "the reason (docs/remote.md, Between servers)")  # fmt: skip
    d.add_argument("--move-to", action="append", metavar="SERVER", default=[],
                   help="a server the leases may move to, tried in the order given (host:port, URL or --cluster "
                        "member name; repeat for more); default: the other members of --cluster")  # fmt: skip
    d.add_argument(
        "--stay",
        action="store_true",
        help="only stop granting: the running leases stay until their programs end",
    )
    u = sub.add_parser("undrain", help="end a drain: the server (or --gpu N) takes new leases again",
                       description="End the drain of a running server, or of its GPU --gpu N: it takes new "
                       "leases again (the same as gpupool-server drain --undo).")  # fmt: skip
    _drain_target_options(u, "end only this GPU's drain (its index)")
    u.set_defaults(undo=True, wait=None, move=False, move_to=[], stay=False)


def _drain_target_options(p, gpu_help: str) -> None:
    """What `drain` and `undrain` name: the server (SERVER, --cluster, --server, --token) and --gpu."""
    p.add_argument("target", nargs="?", metavar="SERVER",
                   help="the server: host:port or URL, or a member name of --cluster (default --server, else "
                        "http://127.0.0.1:56001)")  # fmt: skip
    p.add_argument("--gpu", type=ranged(int, 0, 1023, "a GPU index"), help=gpu_help)
    p.add_argument("--cluster", metavar="etcd://...", help="the cluster SERVER is a member of (names it as "
                   "gpupool-server cluster members lists)")  # fmt: skip
    _admin_options(p)


def _admin_options(p) -> None:
    p.add_argument("--server", type=_pool_server, default=None, metavar="URL",
                   help="the server (default http://127.0.0.1:56001)")  # fmt: skip
    p.add_argument("--token", help="an admin token (default $GPUPOOL_TOKEN)")


def _pool_server(text: str) -> str:
    from server.client_config import ConfigError, normalize_url

    try:
        normalize_url(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text.strip()


def _pool_cluster(text: str) -> str:
    from server.client_config import ConfigError, check_cluster_url

    try:
        return check_cluster_url(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _image(text: str) -> str:
    if not text.strip() or any(c.isspace() for c in text):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an image reference (e.g. registry.example.org/gpupool:0.1.0)"
        )
    return text


def _secret_name(text: str) -> str:
    from server._admission import secret_name_problem

    if why := secret_name_problem(text):
        raise argparse.ArgumentTypeError(why)
    return text


def _webhook_parser(sub) -> None:
    w = sub.add_parser(
        "webhook",
        help="Kubernetes: the mutating admission webhook that gives pods pooled GPUs",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Serve a mutating admission webhook (AdmissionReview v1 at POST /mutate, GET /healthz).\n"
        'A pod annotated gpupool.io/gpu: "0.5" (or "2x0.5", "2", "1x16Gi") gets gpupool copied in by an\n'
        "init container from --image, and its command wrapped in gpuattach run: a lease at container start,\n"
        "released when the command ends or the pod stops. Other pods pass unchanged; a bad request is denied\n"
        "with a message. Manifests: deploy/kubernetes/; set-up: docs/schedulers.md.",
        epilog="example:\n  gpupool-server webhook --image registry.example.org/gpupool:0.1.0 \\\n"
        "      --pool-cluster etcd://etcd1:2379 --tls-cert /tls/tls.crt --tls-key /tls/tls.key",
    )
    w.add_argument("--host", default="0.0.0.0", help="address to bind (default 0.0.0.0)")
    w.add_argument(
        "--port", type=ranged(int, 0, 65535, "a port number"), default=8443, help="port (default 8443)"
    )
    w.add_argument(
        "--tls-cert", type=Path, help="serve HTTPS with this certificate (the API server needs it)"
    )
    w.add_argument("--tls-key", type=Path, help="private key of --tls-cert (PEM)")
    w.add_argument(
        "--image",
        required=True,
        type=_image,
        help="the gpupool image the init container copies gpupool from (deploy/kubernetes/Dockerfile)",
    )
    w.add_argument("--image-pull-policy", default="IfNotPresent", choices=["Always", "IfNotPresent", "Never"])
    w.add_argument(
        "--pool-server",
        action="append",
        default=[],
        type=_pool_server,
        metavar="URL",
        help="a server of the pool the pods ask (repeatable): gpuattach run --server",
    )
    w.add_argument(
        "--pool-cluster",
        type=_pool_cluster,
        metavar="etcd://H:P,...",
        help="discover the pool's servers from this etcd cluster: gpuattach run --cluster",
    )
    w.add_argument(
        "--token-secret",
        default="gpupool-token",
        type=_secret_name,
        help="the Secret (in the pod's namespace, key 'token') with the client token, unless the pod's "
        "gpupool.io/token-secret names another (default gpupool-token)",
    )
    w.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])


def _fail(title: str, hint: str = "") -> int:
    return report("gpupool-server", title, hint, EXIT_USAGE)


def _existing_state(cfg, *, database: bool) -> None:
    """token/client commands act on a server's state: a directory that does not exist (a typo) is an
    error, not a new empty state. ``database``: the server must have run there (it creates pool.sqlite)."""
    from server._errors import PoolError

    where = cfg.state_dir
    if not where.is_dir():
        raise PoolError(
            f"state directory {where} does not exist",
            "pass the --state-dir the server runs with (default /var/lib/gpupool); "
            "gpupool-server creates it when it starts",
        )
    if database and not (where / "pool.sqlite").exists():
        raise PoolError(
            f"no gpupool-server state in {where} (no pool.sqlite)",
            "pass the --state-dir the server runs with, or start gpupool-server there once",
        )


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or (argv[0] not in SUBCOMMANDS and argv[0] not in ("-h", "--help")):
        argv.insert(0, "serve")
    args = _parser().parse_args(argv)
    from server._errors import PoolError

    try:
        if args.command == "token":
            return _token(args)
        if args.command == "client":
            return _client(args)
        if args.command == "cluster":
            return _cluster(args)
        if args.command == "lease":
            return _lease(args)
        if args.command in ("drain", "undrain"):
            return _drain(args)
        if args.command == "webhook":
            return _webhook(args)
        return _serve(args)
    except PoolError as exc:
        return _fail(exc.title, exc.hint)
    except KeyboardInterrupt:
        return 130


def _config(args):
    from collector import durations
    from server._config import check_ranges, load_config
    from server._errors import BadRequest

    cfg = load_config(args.config)
    if args.state_dir:
        cfg.state_dir = args.state_dir
    if args.cluster:
        cfg.cluster = args.cluster
    if args.command in ("token", "client", "cluster"):
        return cfg
    if args.cluster_name:
        cfg.cluster_name = args.cluster_name
    if args.cluster_ttl:
        cfg.cluster_ttl_s = durations.setting(args.cluster_ttl, "--cluster-ttl", BadRequest)
    for name in ("host", "port", "advertise_addr", "simulate_gpus", "mps_pipe_dir", "tls_cert", "tls_key"):
        if getattr(args, name) is not None:
            setattr(cfg, name, getattr(args, name))
    if args.mps:
        cfg.mps = True
    if args.telemetry:
        cfg.telemetry_dir = args.telemetry
    if args.lease_ttl:
        cfg.lease_ttl_s = durations.setting(args.lease_ttl, "--lease-ttl", BadRequest)
    if args.default_limit is not None:
        cfg.default_limit = args.default_limit
    if args.idle_timeout:
        cfg.default_idle_timeout_s = durations.setting(args.idle_timeout, "--idle-timeout", BadRequest)
    if args.max_lease:
        cfg.max_lease_s = durations.setting(args.max_lease, "--max-lease", BadRequest)
    check_ranges(cfg, "serve options")
    return cfg


def _token(args) -> int:
    from collector import durations
    from server import ranges
    from server._errors import BadRequest
    from server._pool import iso
    from server._store import open_store

    cfg = _config(args)
    if not cfg.cluster:
        _existing_state(cfg, database=args.token_command in ("list", "revoke"))
    store = _open_cluster(cfg) if cfg.cluster else open_store(cfg.state_dir)
    if args.token_command in ("create", "import"):
        import re

        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}", args.client):
            return _fail(
                f"client name {args.client!r} is not allowed", "use letters, digits and _ . @ - (max 64)"
            )
        expires = durations.setting(args.expires, "--expires", BadRequest) if args.expires else None
        if why := ranges.problem(ranges.TOKEN, "expires_in_s", expires):
            return _fail(f"--expires {why.removeprefix('expires_in_s ')}", "e.g. --expires 365d")
        given = None
        if args.token_command == "import":
            given = sys.stdin.readline().strip()
            if not re.fullmatch(r"gp_[A-Za-z0-9_-]{20,}", given):
                return _fail(
                    "stdin holds no gpupool token",
                    "pipe one in: echo gp_... | gpupool-server token import CLIENT",
                )
            if store.find_token(given) is not None:
                return _fail("this token is already stored here", "gpupool-server token list shows it")
        row = store.create_token(args.client, admin=args.admin, expires_in_s=expires, token=given)
        if given is None:
            print(row["token"])
        what = "admin token" if args.admin else "token"
        until = f", expires {iso(row['expires'])}" if row["expires"] else ""
        print(
            f"{what} {row['id']} {'imported' if given else 'created'} for client {args.client}{until}; "
            "the server keeps only its hash",
            file=sys.stderr,
        )
    elif args.token_command == "list":
        print(f"{'ID':<14} {'CLIENT':<20} {'ADMIN':<6} {'CREATED':<21} {'EXPIRES':<21} REVOKED")
        for r in store.tokens():
            print(f"{r['id']:<14} {r['client']:<20} {'yes' if r['admin'] else 'no':<6} {iso(r['created']):<21} "
                  f"{iso(r['expires']) or 'never':<21} {iso(r['revoked']) or '-'}")  # fmt: skip
    else:
        row = store.revoke_token(args.token_id)
        if row is None:
            return _fail(f"no token {args.token_id}", "gpupool-server token list shows the ids")
        print(f"revoked {row['id']} (client {row['client']})")
    return 0


def _client(args) -> int:
    """Client policy straight in the state directory: a running server applies it at its next decision."""
    import socket

    from collector import durations
    from server import ranges
    from server._errors import BadRequest
    from server._events import EventLog
    from server._inventory import Inventory
    from server._pool import Pool
    from server._store import open_store
    from server.api import ClientUpdate, convert

    cfg = _config(args)
    _existing_state(cfg, database=args.client_command == "list")
    store = open_store(cfg.state_dir)
    cluster = _open_cluster(cfg) if cfg.cluster else None
    pool = Pool(
        store,
        Inventory(socket.gethostname(), "", (), False),
        cfg,
        EventLog(None, "cli", simulated=False),
        cluster=cluster,
    )
    if args.client_command == "set":
        if args.limit is None and args.idle_timeout is None:
            return _fail("nothing to set", "give --limit and/or --idle-timeout")
        changes = {}
        if args.limit is not None:
            try:
                changes["limit"] = None if args.limit == "default" else float(args.limit)
            except ValueError:
                return _fail(
                    f"--limit {args.limit!r} is not a number", "e.g. --limit 2.5, or --limit default"
                )
        if args.idle_timeout is not None:
            changes["idle_timeout_s"] = (
                None
                if args.idle_timeout == "default"
                else durations.setting(args.idle_timeout, "--idle-timeout", BadRequest)
            )
        for option, field in (("--limit", "limit"), ("--idle-timeout", "idle_timeout_s")):
            if why := ranges.problem(ranges.CLIENT, field, changes.get(field)):
                return _fail(f"{option} {why.removeprefix(field + ' ')}", "see docs/pool.md (Ranges)")
        pool.set_client(args.client, convert(changes, ClientUpdate))
    rows = [c for c in pool.clients() if args.client_command == "list" or c["client"] == args.client]
    print(
        f"{'CLIENT':<20} {'LIMIT':>8} {'(from)':<8} {'IDLE TIMEOUT':>12} {'(from)':<8} {'USAGE':>7} {'LEASES':>6}"
    )
    for r in rows:
        limit = "none" if r["limit"] is None else f"{r['limit']:g}"
        idle = "never" if not r["idle_timeout_s"] else f"{r['idle_timeout_s']:g}s"
        print(f"{r['client']:<20} {limit:>8} {r['limit_source']:<8} {idle:>12} {r['idle_timeout_source']:<8} "
              f"{r['usage']:>7.2f} {r['leases_active']:>6}")  # fmt: skip
    return 0


def _lease(args) -> int:
    """`lease migrate`: through the running server's admin API (it holds the lease's worker)."""
    if not args.to.removeprefix(
        "-"
    ).isdigit():  # a server's name or address: the lease's state leaves its host
        return _lease_to_server(args)
    if args.cluster:
        return _fail(
            "--cluster names the cluster of --to SERVER", "give --to a member name, or drop --cluster"
        )
    try:
        args.to = ranged(int, 0, 1023, "a GPU index")(args.to)
    except argparse.ArgumentTypeError as exc:
        return _fail(f"--to: {exc}", "see gpupool-server lease migrate --help")
    what = f"migrating {args.lease} partition {args.partition} to GPU {args.to}"
    from server.workers import MIGRATE_TIMEOUT_S

    # A move takes as long as its copy: up to the worker's own limit, and the server's answer after it.
    call = lambda client: client.migrate(args.lease, args.to, args.partition)  # noqa: E731
    lease = _admin_call(args, what, call, MIGRATE_TIMEOUT_S + 30)
    if isinstance(lease, int):
        return lease
    m = lease.migration
    print(f"{args.lease}: partition {m.device} moved from GPU {m.from_} to GPU {m.to}: "
          f"{m.bytes / 2**20:.1f} MiB copied, paused {m.pause_s:.3f} s")  # fmt: skip
    return 0


def _lease_to_server(args) -> int:
    """`lease migrate LEASE --to SERVER`: the lease's server sends it to SERVER."""
    target = _drain_target(args.to, args.cluster)
    what = f"migrating {args.lease} to {target}"
    from server.workers import MIGRATE_TIMEOUT_S

    call = lambda client: client.migrate_to_server(args.lease, target)  # noqa: E731
    lease = _admin_call(args, what, call, MIGRATE_TIMEOUT_S + 60)
    if isinstance(lease, int):
        return lease
    m = lease.migration
    print(
        f"{args.lease}: moved to {lease.server.hostname}: {m.bytes / 2**20:.1f} MiB copied, paused {m.pause_s:.3f} s"
    )
    return 0


def _drain(args) -> int:
    """`drain [SERVER] [--gpu N] [--undo]`: through the running server's admin API."""
    if args.target is not None:
        if args.server is not None:
            return _fail("give the server once", "as SERVER or as --server URL, not both")
        args.server = _drain_target(args.target, args.cluster)
    elif args.cluster:
        return _fail(
            "--cluster names the cluster of SERVER",
            "give SERVER: a member name (gpupool-server cluster members)",
        )
    if args.gpu is None:
        return _drain_server(args)
    if args.wait:
        return _fail("--wait is for draining a whole server", "drop --gpu, or drop --wait")
    if args.move or args.move_to or args.stay:
        return _fail(
            "--move and --stay are for draining a whole server",
            "a GPU's drain moves its leases to other GPUs anyway",
        )
    what = f"GPU {args.gpu}: taking leases again" if args.undo else f"draining GPU {args.gpu}"
    done = _admin_call(
        args, what, lambda client: client.drain(args.gpu, undo=args.undo), None
    )  # one move per lease
    if isinstance(done, int):
        return done
    for m in done.moved:
        print(f"{m.lease}: moved from GPU {m.from_} to GPU {m.to}, paused {m.pause_s:.3f} s")
    for s in done.stayed:
        print(f"{s.lease}: stays on GPU {args.gpu}: {s.reason}")
    state = "drained: no new leases go to it" if done.draining else "takes new leases"
    print(f"GPU {args.gpu} {state}" + (f"; {len(done.stayed)} lease(s) stayed" if done.stayed else ""))
    return 1 if done.stayed else 0


def _drain_server(args) -> int:
    if args.wait and args.undo:
        return _fail("--wait is for draining", "drop --wait with --undo")
    if (args.move or args.move_to or args.stay) and args.undo:
        return _fail("--move and --stay are for draining", "drop them with --undo")
    if args.stay and (args.move or args.move_to):
        return _fail("--stay keeps the leases where they are", "give --stay or --move/--move-to, not both")
    # Where the pool has room elsewhere (the cluster's other members, or servers named), the leases move.
    args.move = not args.undo and (args.move or bool(args.move_to) or (bool(args.cluster) and not args.stay))
    if args.move:
        args.move_to = _move_targets(args)
    where = args.server or "the server"
    what = f"{where}: taking leases again" if args.undo else f"draining {where}"
    return _admin_call(args, what, lambda client: _drained(client, args), None)


def _move_targets(args) -> list[str]:
    """The servers `drain --move` tries, as URLs: --move-to's, else the other members of --cluster."""
    from server._errors import BadRequest

    if args.move_to:
        return [_drain_target(target, args.cluster) for target in args.move_to]
    if not args.cluster:
        raise BadRequest(
            "--move needs servers to move leases to", "give --move-to SERVER, or --cluster etcd://..."
        )
    from server._cluster import open_cluster

    here = args.server.rstrip("/") if args.server else ""
    urls = [m["url"] for m in open_cluster(args.cluster, "gpupool-server-cli").members()]
    return [url for url in urls if url.rstrip("/") != here]


def _drained(client, args) -> int:
    """Drain (or undo) through `client`, print the leases that stay, and with --wait wait for them to end."""
    if args.move:  # each remote lease to the first of the servers that takes it: attempts on stderr
        done, moved = client.drain_server_moving(
            args.move_to, lambda line: print(line, file=sys.stderr, flush=True)
        )
        for lease in moved:
            print(f"{lease.id}: moved to {lease.server.hostname}, paused {lease.migration.pause_s:.3f} s")
    else:
        done = client.drain_server(undo=args.undo)
    for s in done.stayed:
        print(f"{s.lease}: stays on {done.server}: {s.reason}")
    state = "drained: it grants no new leases" if done.draining else "grants new leases"
    print(f"server {done.server} {state}" + (f"; {len(done.stayed)} lease(s) stayed" if done.stayed else ""))
    if not done.stayed or not args.wait:
        return 1 if done.stayed else 0
    return _wait_empty(client, done.server, args.wait, {s.lease for s in done.stayed})


def _wait_empty(client, server: str, wait_s: float, running: set[str], poll_s: float = 1.0) -> int:
    """Wait until no lease runs on the drained server, naming on stderr each that ends; 1 if some still
    run after `wait_s`."""
    import time

    deadline = time.monotonic() + wait_s
    print(f"waiting up to {durations.format_duration(wait_s)} for {plural(len(running), 'lease')} to end ...",
          file=sys.stderr)  # fmt: skip
    while running:
        if time.monotonic() >= deadline:
            return report("gpupool-server", f"{plural(len(running), 'lease')} left on {server} after "
                          f"{durations.format_duration(wait_s)}: {', '.join(sorted(running))}",
                          "wait longer (--wait), or release them", 1)  # fmt: skip
        time.sleep(min(poll_s, max(0.0, deadline - time.monotonic())))
        now = {lease.id for lease in client.leases()}
        for ended in sorted(running - now):
            print(f"{ended} ended; {plural(len(running & now), 'lease')} left", file=sys.stderr)
        running &= now
    print(f"server {server} drained: no lease runs on it")
    return 0


def _drain_target(target: str, cluster: str | None) -> str:
    """SERVER's URL: a cluster member's (by its name), or SERVER itself as host:port or URL."""
    from server._errors import BadRequest, NotFound
    from server.client_config import ConfigError, normalize_url

    if cluster:
        from server._cluster import open_cluster

        members = {m["name"]: m["url"] for m in open_cluster(cluster, "gpupool-server-cli").members()}
        if target in members:
            return members[target]
        if target not in members.values():
            raise NotFound(f"cluster {cluster} has no member {target!r}",
                           f"its members: {', '.join(sorted(members)) or 'none'}")  # fmt: skip
    try:
        return normalize_url(target)
    except ConfigError as exc:
        raise BadRequest(f"SERVER {target!r}: {exc.title}", exc.hint) from None


def _admin_call(args, what: str, call, timeout: float | None):
    """`call(ServerClient)` against --server with the admin token; its answer, or the exit status.
    `timeout`: of the HTTP call, in seconds (None: as long as it takes)."""
    import os

    from server._config import DEFAULT_PORT
    from server.client import ServerClient, ServerClientOptions
    from server.client_errors import PoolClientError

    token = args.token or os.environ.get("GPUPOOL_TOKEN")
    if not token:
        return _fail(
            "no admin token",
            "pass --token or set GPUPOOL_TOKEN; gpupool-server token create NAME --admin makes one",
        )
    print(f"{what} ...", file=sys.stderr)
    client = ServerClient(
        args.server or f"http://127.0.0.1:{DEFAULT_PORT}", token, ServerClientOptions(timeout_s=timeout)
    )
    try:
        return call(client)
    except PoolClientError as exc:
        return _fail(
            exc.title, "is gpupool-server running there? pass --server URL" if exc.unreachable else exc.hint
        )


def _open_cluster(cfg):
    import socket

    from server._cluster import open_cluster

    return open_cluster(cfg.cluster, cfg.cluster_name or f"{socket.gethostname()}:{cfg.port}")


def _cluster(args) -> int:
    cfg = _config(args)
    if not cfg.cluster:
        return _fail("no cluster given", "pass --cluster etcd://host1:2379,... (or cluster = in server.toml)")
    cluster = _open_cluster(cfg)
    if args.cluster_command == "members":
        members = cluster.members()
        print(f"{'MEMBER':<28} {'URL':<32} {'HOSTNAME':<20} GPUS")
        for m in sorted(members, key=lambda m: m["name"]):
            names = [g["name"] for g in m["gpus"]]
            gpus = ", ".join(f"{names.count(n)}x {n}" for n in dict.fromkeys(names))
            drain = "  (draining: no new leases)" if m.get("draining") else ""
            print(f"{m['name']:<28} {m['url']:<32} {m['hostname']:<20} {gpus}{drain}")
        print(f"({plural(len(members), 'server')} registered)", file=sys.stderr)
        return 0
    from server._cluster_migrate import migrate
    from server._store import open_store

    if not (cfg.state_dir / "pool.sqlite").exists():
        return _fail(f"no embedded store in {cfg.state_dir}", "pass --state-dir of the server to migrate")
    store = open_store(cfg.state_dir)
    name = args.name or cluster.name
    report = migrate(store, cluster, name)
    for line in report["lines"]:
        print(line)
    print(
        f"migrated {plural(report['tokens'], 'token')}, {plural(report['clients'], 'client setting')}, "
        f"{plural(report['policy'], 'policy value')} and {plural(report['leases'], 'live lease')} to {cfg.cluster} "
        f"(attached to member {name}: start that server with --cluster within {report['grace_h']:g}h)",
        file=sys.stderr,
    )
    return 0


def _serve(args) -> int:
    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    cfg = _config(args)
    import asyncio

    from server._serve import serve

    return asyncio.run(serve(cfg))


def _webhook(args) -> int:
    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    if not args.pool_server and not args.pool_cluster:
        return _fail(
            "the webhook needs to know the pool",
            "give --pool-server URL (repeatable) or --pool-cluster etcd://H:P,...",
        )
    import asyncio

    from server._admission import WebhookOptions
    from server._webhook import ListenOptions, serve_webhook

    options = WebhookOptions(
        image=args.image,
        servers=args.pool_server,
        cluster=args.pool_cluster,
        token_secret=args.token_secret,
        image_pull_policy=args.image_pull_policy,
    )
    listen = ListenOptions(args.host, args.port, args.tls_cert, args.tls_key)
    return asyncio.run(serve_webhook(options, listen))


if __name__ == "__main__":
    sys.exit(main())
