"""``gpuattach``: attach GPUs from the pool for a run, or for a session of runs.

    gpuattach list-gpus | servers | smi [LEASE] | leases
    gpuattach run -n 2 -p 0.5 [--filter device.name=H100] [--local] [--timeout 10m] -- python train.py
    gpuattach request -n 1 -m 8192      # prints a lease id; a small keeper process heartbeats it
    gpuattach run --lease LEASE -- python step1.py
    gpuattach release LEASE

Exit codes, one scheme for every subcommand (docs/pool.md, "Exit codes"): 0 done; 125 gpuattach
itself failed (bad usage or an argument out of range, refused before the pool is asked; config or
token; pool unreachable; no GPUs within --timeout; a lease that cannot serve the run; ``servers``: a
server is down); 130 interrupted before the command started. ``run`` also: 126 the command cannot be
executed, 127 it is not found, anything else is the command's own status (128+N when signal N ended it).

Imports stay light (standard library only) so ``gpuattach --help`` is instant.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from collector.durations import format_duration
from collector.errors import report, report_error
from collector.words import plural
from server import ranges
from server.client_errors import PoolClientError
from virtualize.client._session import on_this_host, start_keeper

if TYPE_CHECKING:
    from server.api import Lease, ServerInfo

EXIT_OK, EXIT_FAILED, EXIT_CANNOT_EXEC, EXIT_NOT_FOUND, EXIT_INTERRUPTED = 0, 125, 126, 127, 130
MIB = 1 << 20


class _Parser(argparse.ArgumentParser):
    """Bad usage is one line and exit 125, like every other failure of gpuattach's own (not argparse's 2,
    which ``run`` could not tell from the command's own status 2)."""

    def error(self, message: str):
        sys.exit(report("gpuattach", message, f"{self.prog} --help", EXIT_FAILED))


def _request_field(field: str, example: str):
    """An argparse type for one field of a lease request, in the range the servers take
    (``server.ranges``): refused here in one line, before any server is asked."""
    r = ranges.REQUEST[field]

    def parse(text: str):
        try:
            value = int(text) if r.whole else float(text)
        except ValueError:
            noun = "a whole number" if r.whole else "a number"
            raise argparse.ArgumentTypeError(f"not {noun}: {text!r} ({r.text()}, e.g. {example})") from None
        if why := r.problem(value):
            raise argparse.ArgumentTypeError(f"{why}, e.g. {example}")
        return value

    return parse


def _parser() -> argparse.ArgumentParser:
    def pool_options(suppress: bool) -> argparse.ArgumentParser:
        # Given before or after the subcommand; after it, absent options must not overwrite ones given before.
        extra = {"default": argparse.SUPPRESS} if suppress else {}
        parent = _Parser(add_help=False)
        g = parent.add_argument_group("pool")
        g.add_argument(
            "--config",
            help="client config file (default $GPUPOOL_CONFIG or ~/.config/gpupool/client.toml)",
            **extra,
        )
        g.add_argument(
            "--server",
            action="append",
            metavar="URL",
            help="a server of the pool (repeatable, or comma-separated); replaces the config's list",
            **extra,
        )
        g.add_argument(
            "--token", help="the client token (default: from the config, or $GPUPOOL_TOKEN)", **extra
        )
        g.add_argument(
            "--cluster",
            metavar="etcd://H:P,...",
            help="discover the pool's servers from this etcd cluster (gpupool-server --cluster)",
            **extra,
        )
        return parent

    common = pool_options(suppress=True)
    p = _Parser(
        prog="gpuattach",
        description="Attach GPUs (whole or partitions) from a pool of gpupool-server hosts. See docs/pool.md.",
        parents=[pool_options(suppress=False)],
    )
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)

    lg = sub.add_parser("list-gpus", parents=[common], help="the pool's GPUs and their free memory")
    lg.add_argument("--json", action="store_true", help="print the servers' answers as JSON")
    sv = sub.add_parser("servers", parents=[common], help="health of every server of the pool")
    sv.add_argument("--json", action="store_true", help="print the servers' answers as JSON")
    sm = sub.add_parser("smi", parents=[common], help="an nvidia-smi-like table of the pool, or of one lease")
    sm.add_argument("lease", nargs="?", help="show only this lease")
    ls = sub.add_parser("leases", parents=[common], help="your leases on every server")
    ls.add_argument("--ended", action="store_true", help="include ended leases (with why they ended)")
    ls.add_argument("--json", action="store_true", help="print the leases as JSON")

    def sizing(sp, required: bool):
        sp.add_argument(
            "-n",
            "--num-gpus",
            type=_request_field("n", "2"),
            required=required,
            metavar="N",
            help=f"number of GPUs, {ranges.REQUEST['n'].text()}, each a separate physical GPU of one server",
        )
        size = sp.add_mutually_exclusive_group()
        size.add_argument(
            "-p",
            "--partial",
            type=_request_field("fraction", "0.5"),
            metavar="P",
            help=f"partition size as a fraction of each GPU's memory, {ranges.REQUEST['fraction'].text()} "
            "(default 1; the smallest partition is 1/64 of a GPU)",
        )
        size.add_argument(
            "-m",
            "--memory",
            type=_request_field("mem_mib", "8192"),
            metavar="MIB",
            help="partition size in MiB of GPU memory (at least 1/64 of the GPU is reserved)",
        )
        sp.add_argument(
            "--sm-share",
            type=_request_field("sm_share", "0.5"),
            metavar="S",
            help=f"share of the GPU's SMs, {ranges.REQUEST['sm_share'].text()} (enforced with MPS)",
        )
        sp.add_argument("--filter", action="append", default=[], metavar="KEY OP VALUE",
                        help="only servers/GPUs that match, e.g. device.name=H100, device.phy-memory>=40000 (repeatable)")  # fmt: skip
        sp.add_argument(
            "--timeout",
            metavar="DURATION",
            help="how long to wait for free GPUs (default: config's timeout, 10m)",
        )
        sp.add_argument(
            "--local",
            action="store_true",
            help="run on the GPU host itself (CUDA_VISIBLE_DEVICES + MPS limits) instead of remotely; "
            "a lease requested with --local is run with --local by itself",
        )

    rq = sub.add_parser("request", parents=[common], help="take a lease for a session of runs; prints its id")
    sizing(rq, required=True)
    rq.add_argument(
        "--no-keeper",
        action="store_true",
        help="do not start the keeper process (you heartbeat the lease yourself)",
    )
    rl = sub.add_parser("release", parents=[common], help="release leases")
    rl.add_argument("leases", nargs="+", metavar="LEASE")
    rn = sub.add_parser(
        "run", parents=[common], help="run a command on leased GPUs and release them after",
        usage="gpuattach run [-n N (-p P | -m MIB) | --lease LEASE] [options] -- COMMAND [ARGS...]",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Take a lease (or use --lease), run COMMAND on it, release it when COMMAND ends, on Ctrl-C\n"
        "or on SIGTERM (forwarded to COMMAND). Without --local, COMMAND's CUDA calls run remotely on the\n"
        "lease (docs/remote.md); with --local it runs on this GPU host inside its partition. Either way\n"
        "CUDA (cuMemGetInfo, cuDeviceTotalMem) and NVML (nvidia-smi, pynvml) report the partition's memory.",
        epilog="examples:\n  gpuattach run -n 2 -p 0.5 --filter device.name=H100 -- python train.py\n"
        "  gpuattach run --local -n 1 -m 16384 --timeout 30m -- ./solver --big\n"
        "  gpuattach run --lease LEASE -- python step1.py   (local or remote, as the lease was requested)\n"
        "  gpuattach run -n 2 --spread -- torchrun --nproc-per-node 2 train.py   (one GPU on each of 2 servers)\n\n"
        "placement: -n N takes N separate physical GPUs of ONE server (their GPUs talk over NVLink/PCIe there);\n"
        "--spread takes one GPU on each of N different servers instead, one lease each, and the process whose\n"
        "LOCAL_RANK is r uses server r's GPU as its device 0 (docs/remote.md, \"Many GPUs in one run\"); its NCCL\n"
        "runs in each rank's worker, the workers connected server to server (GPUPOOL_NCCL=off: in COMMAND).\n\n"
        "exit status: COMMAND's (128+N when signal N ended it); 125 gpuattach failed (bad usage, no GPUs\n"
        "within --timeout, bad token, pool unreachable); 126 COMMAND not executable; 127 COMMAND not found",
    )  # fmt: skip
    sizing(rn, required=False)
    rn.add_argument(
        "--lease", help="use this lease (from gpuattach request) instead of taking one; it is not released"
    )
    rn.add_argument(
        "--spread",
        action="store_true",
        help="one GPU on each of N different servers (one lease each) instead of N GPUs of one server; "
        "the process whose LOCAL_RANK is r runs on the r-th (remote runs only)",
    )
    rn.add_argument(
        "--isolate",
        action="store_true",
        help="each process of COMMAND gets a worker process of its own on the GPU server, so a fault in one "
        "process's kernels (a device-side assert) ends only that process's CUDA context, as natively; their "
        "memory still counts against one partition. CUDA IPC memory, event and pool handles, and virtual memory "
        "exported as a POSIX descriptor, still open across processes; the lease does not move (remote runs "
        'only; docs/remote.md, "Isolation")',
    )
    rn.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- COMMAND", help="the command to run")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    handler = {
        "list-gpus": cmd_list_gpus,
        "servers": cmd_servers,
        "smi": cmd_smi,
        "leases": cmd_leases,
        "request": cmd_request,
        "release": cmd_release,
        "run": cmd_run,
    }[args.command]
    try:
        return handler(args)
    except PoolClientError as exc:
        return report_error("gpuattach", exc)
    except KeyboardInterrupt:
        print("gpuattach: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


def _fail(title: str, hint: str = "", code: int = EXIT_FAILED) -> int:
    return report("gpuattach", title, hint, code)


def _client(args):
    from server.client import PoolClient
    from server.client_config import load

    return PoolClient(load(args.config, args.server, args.token, getattr(args, "cluster", None)))


def _human(n: int | None) -> str:
    if n is None:
        return "-"
    return f"{n / (1 << 30):.1f}GiB" if n >= 1 << 30 else f"{n // MIB}MiB"


def _short(url: str) -> str:
    return url.split("://", 1)[-1]


def _table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(header, widths, strict=True)).rstrip()]
    lines += ["  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    return "\n".join(lines)


def _print_answers_json(answers) -> None:
    """Each server's answer (or its error) as one JSON list, for --json."""
    # "url" is the address asked; a server's own answer carries its identity under "server".
    import msgspec

    rows = [
        {"url": s.url, **msgspec.to_builtins(a)}
        if not isinstance(a, Exception)
        else {"url": s.url, "error": a.title}
        for s, a in answers
    ]
    print(json.dumps(rows, indent=1))


def _answered(answers) -> list:
    """The servers' answers that are not errors. Each error is a warning while some server answered;
    when none did, the (last) error is raised: one error line, its hint, exit 125, never "no leases"."""
    errors = [a for _, a in answers if isinstance(a, Exception)]
    if errors and len(errors) == len(answers):
        for a in errors[:-1]:
            print(f"gpuattach: warning: {a.title}", file=sys.stderr)
        raise errors[-1]
    for a in errors:  # each title names its server once
        print(f"gpuattach: warning: {a.title}", file=sys.stderr)
    return [(s, a) for s, a in answers if not isinstance(a, Exception)]


# --- read-only commands ---------------------------------------------------------------------------------
def cmd_list_gpus(args) -> int:
    from server.api import GpuList

    client = _client(args)
    answers = client.each("GET", "/v1/gpus", GpuList)
    if args.json:
        _print_answers_json(answers)
        return EXIT_OK if any(isinstance(a, GpuList) for _, a in answers) else EXIT_FAILED
    rows = []
    for server, a in _answered(answers):
        tag = " (simulated)" if a.simulated else ""
        for g in a.gpus:
            rows.append([_short(server.url), a.server.hostname + tag, str(g.index), g.name,
                         _human(g.mem_total_bytes), _human(g.mem_free_bytes), f"{g.free_fraction:.2f}",
                         str(len(g.partitions))])  # fmt: skip
    if rows:
        print(_table(rows, ["SERVER", "HOST", "GPU", "NAME", "MEMORY", "FREE", "FREE_FRAC", "LEASES"]))
    else:
        print("no GPUs", file=sys.stderr)
    return EXIT_OK


def cmd_servers(args) -> int:
    """Each server's health, and whether it takes this client's token: a server that answers but
    refuses the token cannot serve this client, so it is not "up" (and the exit status says so)."""
    import msgspec

    from server.api import Health, LeaseList
    from server.client import ApiError, ConfigError

    client = _client(args)
    start = time.perf_counter()
    answers = client.each("GET", "/v1/health", Health, auth=False)
    answering = [s for s, a in answers if isinstance(a, Health)]
    checks = dict(client.each("GET", "/v1/leases", LeaseList, servers=answering)) if answering else {}
    took = time.perf_counter() - start
    # A server that answered is up unless it refused the token (any other error is not the token's).
    refused = {
        s.url: c
        for s, c in checks.items()
        if isinstance(c, ConfigError) or (isinstance(c, ApiError) and c.status == 401)
    }
    if args.json:

        def token_state(server) -> str:
            check = checks[server]
            if isinstance(check, LeaseList):
                return "accepted"
            if isinstance(check, ConfigError):
                return "missing: " + check.title
            return ("refused: " if server.url in refused else "not checked: ") + check.title

        rows = [{"url": s.url, **msgspec.to_builtins(a), "token": token_state(s)} if isinstance(a, Health)
                else {"url": s.url, "error": a.title} for s, a in answers]  # fmt: skip
        print(json.dumps(rows, indent=1))
        return EXIT_OK if len(answering) == len(answers) and not refused else EXIT_FAILED
    rows = []
    for server, a in answers:
        if isinstance(a, Health):
            info = a.server
            flags = ",".join(
                f
                for f, on in (
                    ("simulated", info.simulated),
                    ("mps", info.mps),
                    ("tls", info.tls),
                    ("state disk full: no new leases", not a.store.writable),
                    ("draining: no new leases", info.draining),
                )
                if on
            )
            status, notes = ("up" if a.status == "ok" else a.status), flags or "-"  # degraded: full disk
            if server.url in refused:
                no_token = isinstance(refused[server.url], ConfigError)
                status, notes = "NO TOKEN" if no_token else "TOKEN REFUSED", refused[server.url].title
            rows.append([_short(server.url), status, info.hostname, str(info.gpu_count), str(a.leases_active),
                         info.driver_version or "-", info.cuda_version or "-", notes])  # fmt: skip
        else:
            rows.append([_short(server.url), "DOWN", "-", "-", "-", "-", "-", a.title])
    print(_table(rows, ["SERVER", "STATUS", "HOST", "GPUS", "LEASES", "DRIVER", "CUDA", "NOTES"]))
    print(f"({plural(len(answers), 'server')} asked at once in {took * 1000:.0f} ms)", file=sys.stderr)
    if refused:
        first = next(iter(refused.values()))
        no_token = isinstance(first, ConfigError)
        return _fail(
            first.title if no_token else f"{plural(len(refused), 'server')} refused the token: {first.title}",
            first.hint or "check the token in client.toml / --token / GPUPOOL_TOKEN",
        )
    return EXIT_OK if len(answering) == len(answers) else EXIT_FAILED


def _lease_rows(leases: list[tuple[str, Lease]]) -> list[list[str]]:
    rows = []
    for url, lease in leases:
        parts = ", ".join(
            f"GPU{p.gpu_index}:{_human(p.mem_bytes)}({p.fraction:.2f})" for p in lease.partitions
        )
        state = lease.state + (f": {lease.reason}" if lease.state != "active" and lease.reason else "")
        rows.append([lease.id, _short(url), lease.client, parts, lease.expires_at[11:19] if lease.state == "active" else "-",
                     "local" if lease.local else ("remote" if lease.remote else "-"), state])  # fmt: skip
    return rows


def cmd_leases(args) -> int:
    import msgspec

    from server.api import LeaseList

    client = _client(args)
    answers = client.each("GET", f"/v1/leases?state={'any' if args.ended else 'active'}", LeaseList)
    leases = [(s.url, lease) for s, a in _answered(answers) for lease in a.leases]
    if args.json:
        print(json.dumps([{"server": u, **msgspec.to_builtins(lease)} for u, lease in leases], indent=1))
    elif leases:
        print(
            _table(
                _lease_rows(leases), ["LEASE", "SERVER", "CLIENT", "PARTITIONS", "EXPIRES", "KIND", "STATE"]
            )
        )
    else:
        print("no leases", file=sys.stderr)
    return EXIT_OK


def _box(sections: list[list[str]]) -> str:
    """nvidia-smi's look: sections of lines in one box, as wide as the widest line."""
    width = max(len(line) for sec in sections for line in sec) + 2
    bar = "+" + "-" * width + "+"
    out = [bar]
    for sec in sections:
        out += ["| " + line.ljust(width - 2) + " |" for line in sec]
        out.append(bar)
    return "\n".join(out)


def cmd_smi(args) -> int:
    client = _client(args)
    now = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    if args.lease:
        server, lease = client.find_lease(args.lease)
        head = [f"gpuattach smi — lease {lease.id}   {now}"]
        info = [
            f"server {_short(server.url)} ({lease.server.hostname})  client {lease.client}  state {lease.state}"
            + ("  SIMULATED" if lease.simulated else ""),
            f"created {lease.created_at}  expires {lease.expires_at}  idle timeout "
            f"{_secs(lease.idle_timeout_s)}  memory limit {'enforced by MPS' if lease.mps else 'advisory (no MPS)'}",
        ]
        if lease.reason:
            info.append(f"reason: {lease.reason}")
        rows = [f"{'GPU':>3}  {'Name':<30} {'Partition':>26}  {'SM share':>8}  UUID"]
        for p in lease.partitions:
            part = f"{_human(p.mem_bytes)} / {_human(p.mem_total_bytes)} ({p.fraction:.2f})"
            rows.append(
                f"{p.gpu_index:>3}  {p.gpu_name[:30]:<30} {part:>26}  {p.sm_share or '-':>8}  {p.gpu_uuid}"
            )
        print(_box([head, info, rows]))
        return EXIT_OK
    from server.api import GpuList

    answers = client.each("GET", "/v1/gpus", GpuList)
    ok = _answered(answers)
    n_gpus = sum(len(a.gpus) for _, a in ok)
    sections = [
        [
            f"gpuattach smi — pool of {plural(len(answers), 'server')} ({len(ok)} up), {plural(n_gpus, 'GPU')}   {now}"
        ]
    ]
    for server, a in ok:
        info = a.server
        sec = [
            f"{info.hostname}  {_short(server.url)}  driver {info.driver_version or '-'}  "
            f"CUDA {info.cuda_version or '-'}{'  MPS' if info.mps else ''}{'  SIMULATED' if a.simulated else ''}",
            f"{'GPU':>3}  {'Name':<30} {'Leased / Total':>20}  {'Use':>4}         {'GPU-Util':>8}  {'Mem-Used':>9}"
            "  Partitions (client:fraction)",
        ]
        for g in a.gpus:
            used = g.mem_total_bytes - g.mem_free_bytes
            pct = 100 * used / g.mem_total_bytes if g.mem_total_bytes else 0
            meter = "#" * round(pct / 20)
            parts = " ".join(f"{p.client}:{p.fraction:.2f}" for p in g.partitions) or "-"
            mem = _human(used) + " / " + _human(g.mem_total_bytes)
            live = g.live  # the server's newest NVML sample (real GPUs only)
            util = f"{live.util_gpu_mean * 100:.0f}%" if live and live.util_gpu_mean is not None else "-"
            real = _human(live.mem_used_bytes) if live and live.mem_used_bytes is not None else "-"
            sec.append(
                f"{g.index:>3}  {g.name[:30]:<30} {mem:>20}  {pct:>3.0f}%  [{meter:<5}]  {util:>8}  {real:>9}  {parts}"
            )
        sections.append(sec)
    print(_box(sections))
    return EXIT_OK


def _secs(value) -> str:
    return "none" if not value else format_duration(value, "exact")


# --- leases ----------------------------------------------------------------------------------------------
def _request_from(args, *, local: bool, remote: bool, pids=(), label=None):
    from server.client import LeaseRequest

    if args.num_gpus is None:
        raise _usage("give -n N (and -p P or -m MIB), or --lease LEASE")
    fraction = args.partial if args.partial is not None else (None if args.memory is not None else 1.0)
    try:
        return LeaseRequest(n=args.num_gpus, fraction=fraction, mem_mib=args.memory, sm_share=args.sm_share,
                            filters=list(args.filter), local=local, remote=remote, pids=list(pids), label=label)  # fmt: skip
    except ValueError as exc:  # a value out of its range (server.ranges), refused as the server would
        raise _usage(str(exc)) from None


def _usage(title: str):
    return PoolClientError(title, "see gpuattach run --help")


def _timeout(args, client) -> float:
    from server.client_config import wait_setting

    return wait_setting(args.timeout, "--timeout") if args.timeout else client.cfg.timeout_s


def _wait_note(msg: str) -> None:
    print(f"gpuattach: {msg}", file=sys.stderr, flush=True)


def cmd_request(args) -> int:
    client = _client(args)
    # A session lease is for `run --lease`: remote unless --local, so a server that cannot run remote
    # work (simulated GPUs) refuses it now rather than at the first run.
    req = _request_from(args, local=args.local, remote=not args.local, label="session (gpuattach request)")
    server, lease = client.acquire(
        req,
        timeout_s=_timeout(args, client),
        accept=on_this_host if args.local else None,
        on_wait=_wait_note,
    )
    if not args.no_keeper:
        start_keeper(client, server, lease)
    print(lease.id)
    parts = ", ".join(f"GPU{p.gpu_index} {_human(p.mem_bytes)}" for p in lease.partitions)
    keeper = (
        "a keeper process heartbeats it" if not args.no_keeper else f"heartbeat it within {lease.ttl_s:g}s"
    )
    kind = "local" if args.local else "remote"
    print(f"gpuattach: {kind} lease {lease.id} on {_short(server.url)} ({parts}); {keeper}; "
          f"gpuattach run --lease {lease.id} -- COMMAND runs on it; gpuattach release {lease.id} when done",
          file=sys.stderr)  # fmt: skip
    return EXIT_OK


def cmd_release(args) -> int:
    client = _client(args)
    failed = 0
    for lease_id in args.leases:
        try:
            server, _ = client.find_lease(lease_id)
            lease = client.release(server, lease_id)
            how = (
                "released"
                if "released by" in (lease.reason or "") and lease.state == "released"
                else lease.state
            )
            print(f"{lease_id}: {how}" + (f" ({lease.reason})" if lease.reason else ""))
        except PoolClientError as exc:
            failed += 1
            print(f"gpuattach: error: {lease_id}: {exc.title}", file=sys.stderr)
    return EXIT_FAILED if failed else EXIT_OK


# --- run --------------------------------------------------------------------------------------------------
class _Run:
    """Runs the command under a lease: environment, heartbeats, signal forwarding, release."""

    def __init__(self, client, server, lease: Lease, owned: bool):
        self.client, self.server, self.lease, self.owned = client, server, lease, owned
        self.spread: list[tuple] = []  # --spread: (server, lease) of every rank, this one first
        self.child: subprocess.Popen | None = None
        self.ended_reason: str | None = None
        self._killer: threading.Timer | None = None
        # (lease id, the file saying where its worker has been, those workers): rewritten as the lease moves
        self.worker_files: list[tuple[str, Path, list]] = []

    @property
    def leases(self) -> list[tuple]:
        return self.spread or [(self.server, self.lease)]

    def on_lease_end(self, state: str, reason: str, lease_id: str | None = None) -> None:
        self.ended_reason = f"lease {lease_id or self.lease.id} was {state}: {reason}"
        print(f"gpuattach: {self.ended_reason}; stopping the command", file=sys.stderr, flush=True)
        self._signal_child(signal.SIGTERM)
        self._killer = threading.Timer(10.0, self._signal_child, args=(signal.SIGKILL,))
        self._killer.daemon = True
        self._killer.start()

    def _signal_child(self, sig: int) -> None:
        if self.child is not None and self.child.poll() is None:
            # the command and everything it started
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.child.pid, sig)

    def forward(self, signum, _frame) -> None:
        self._signal_child(signum)


def cmd_run(args) -> int:
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        return _fail(
            "no command to run", "put it after --, e.g. gpuattach run -n 1 -p 0.5 -- python train.py"
        )
    if args.lease and (args.num_gpus is not None or args.partial is not None or args.memory is not None):
        return _fail(
            "--lease takes an existing lease; drop -n/-p/-m", "gpuattach run --lease LEASE -- COMMAND"
        )
    if not args.lease and args.num_gpus is None:
        return _fail("give -n N (and -p P or -m MIB), or --lease LEASE", "see gpuattach run --help")
    if args.isolate and args.local:
        return _fail(
            "--isolate is for remote runs: with --local each process already has its own CUDA context"
        )
    if args.spread and (args.lease or args.local):
        return _fail("--spread takes new remote leases, one per server",
                     "drop --lease / --local, or drop --spread")  # fmt: skip
    client = _client(args)
    if args.lease:
        server, lease = client.find_lease(args.lease)
        if lease.state != "active":
            return _fail(f"lease {lease.id} is {lease.state}: {lease.reason}", "request a new lease")
        if lease.local:
            args.local = True  # a lease requested with --local runs the way it was requested
            if args.isolate:
                return _fail(f"--isolate is for remote runs: lease {lease.id} was requested with --local, "
                             "where each process already has its own CUDA context")  # fmt: skip
        elif args.local and lease.remote:
            return _fail(
                f"lease {lease.id} was requested for remote runs",
                "drop --local, or request a lease with gpuattach request --local",
            )
        owned = False
    else:
        req = _request_from(args, local=args.local, remote=not args.local,
                            pids=(os.getpid(),) if args.local else (), label=shlex.join(cmd)[:200])  # fmt: skip
        if args.spread:
            spread = _acquire_spread(client, req, _timeout(args, client))
            server, lease = spread[0]
        else:
            server, lease = client.acquire(
                req,
                timeout_s=_timeout(args, client),
                accept=on_this_host if args.local else None,
                on_wait=_wait_note,
            )
        owned = True
    remote_env = None
    if not args.local:
        try:
            from virtualize.client.remote import remote_env
        except ImportError as exc:
            for taken_server, taken in spread if args.spread else [(server, lease)]:
                _release_quietly(client, taken_server, taken, owned)
            return _fail(f"remote execution is not available in this installation ({exc})",
                         "run on a GPU host with --local, or install gpupool's client with the shim")  # fmt: skip
    run = _Run(client, server, lease, owned)
    if args.spread:
        run.spread = spread
    try:
        return _run_under_lease(args, cmd, run, remote_env)
    finally:
        for server, lease in run.leases if owned else ():
            try:
                client.release(server, lease.id)
            except PoolClientError as exc:
                if run.ended_reason is None:
                    print(f"gpuattach: warning: could not release {lease.id} ({exc.title}); "
                          f"it expires {lease.ttl_s:g}s after the last heartbeat", file=sys.stderr)  # fmt: skip


def _acquire_spread(client, req, timeout_s: float) -> list[tuple]:
    """--spread -n N: one lease of one GPU on each of N different servers, taken one after the other
    (a server already holding one is refused for the next); all released if one cannot be had."""
    import msgspec

    one = msgspec.structs.replace(req, n=1)
    taken: list[tuple] = []
    deadline = time.monotonic() + timeout_s

    def identity(info: ServerInfo) -> tuple:
        return info.hostname, info.addr, info.port

    def elsewhere(info: ServerInfo) -> str | None:
        if identity(info) in {identity(lease.server) for _, lease in taken}:
            return f"already holds a GPU of this run (--spread: one GPU per server, {req.n} servers needed)"
        return None

    try:
        while len(taken) < req.n:
            left = max(0.0, deadline - time.monotonic())
            taken.append(client.acquire(one, timeout_s=left, accept=elsewhere, on_wait=_wait_note))
    except BaseException:
        for server, lease in taken:
            _release_quietly(client, server, lease, True)
        raise
    return taken


def _release_quietly(client, server, lease, owned: bool) -> None:
    if owned:
        with contextlib.suppress(Exception):
            client.release(server, lease.id)


def _run_under_lease(args, cmd, run: _Run, remote_env) -> int:
    lease = run.lease
    env = dict(os.environ)
    if args.local:
        if refusal := on_this_host(lease.server):
            return _fail(refusal, "drop --local to run remotely")
        env.update(lease.env or {})
        _local_cuda(lease, env)
        if not lease.mps:
            limits = ", ".join(_human(p.mem_bytes) for p in lease.partitions)
            print(f"gpuattach: note: {lease.server.hostname} runs without MPS: the partition's memory limit ({limits}) is advisory",
                  file=sys.stderr)  # fmt: skip
    else:
        try:
            if run.spread:
                from virtualize.client.remote import spread_env

                env.update(spread_env([answer for _, answer in run.spread]))
            else:
                env.update(remote_env(lease))
            _nccl_forwarding(env, spread=bool(run.spread))
            if args.isolate:
                env["GPUPOOL_ISOLATE"] = "1"  # read by the shim in each process (virtualize/client/shim)
        except (
            Exception
        ) as exc:  # the shim is not built, the lease has no worker, …: one line, lease released
            hint = "see docs/remote.md"
            if not lease.remote:
                hint = "this lease was not requested for remote runs: pass --local on its GPU host, or request a new one"
            return _fail(f"cannot set up remote execution: {exc}", hint)
    if lease.simulated:
        print(f"gpuattach: note: lease {lease.id} is on SIMULATED GPUs (control plane only)", file=sys.stderr)
    # A file a helper thread left behind never turns the run's end into a traceback.
    with tempfile.TemporaryDirectory(prefix="gpupool-run-", ignore_cleanup_errors=True) as scratch:
        view = _nvml_view(run, env, Path(scratch), local=args.local)
        if not args.local:
            _worker_files(run, env, Path(scratch))
        try:
            return _run_command(args, cmd, run, env, view)
        finally:
            if view is not None:
                view.stop()


def _worker_files(run: _Run, env: dict, scratch: Path) -> None:
    """Where each of the run's leases' worker is, in a file the shim reads at each new connection (one per
    rank under --spread, named as the shim picks lease r's variables); rewritten when a lease moves to another
    server (`_follow_move`), so that processes started after the move find it."""
    from virtualize.client import _worker_file
    from virtualize.common import _wire

    for rank, (_, lease) in enumerate(run.leases):
        if not lease.worker:
            continue
        path = scratch / f"worker-{rank}"
        try:
            _worker_file.write(path, [lease.worker])
        except OSError as exc:  # the run goes on; only a process started after a move would miss the lease
            print(f"gpuattach: note: cannot write the run's worker file ({exc.strerror or exc}): a process "
                  "started after the lease moves to another server will not find it", file=sys.stderr)  # fmt: skip
            continue
        if rank == 0:  # (also a process that is no rank of a --spread run talks to lease 0)
            env[_wire.ENV_WORKER_FILE] = str(path)
        if run.spread:
            env[f"{_wire.ENV_WORKER_FILE}_{rank}"] = str(path)
        run.worker_files.append((lease.id, path, [lease.worker]))


def _follow_move(run: _Run, view, lease_id: str, server) -> None:
    """A lease of the run moved to `server` (its heartbeats were told so): its worker file names the new
    worker, and its NVML view is fetched from there."""
    import urllib.parse

    from server.api import Lease
    from virtualize.client import _worker_file

    lease = run.client.call(server, "GET", f"/v1/leases/{urllib.parse.quote(lease_id)}", Lease)
    for owner, path, workers in run.worker_files:
        if owner == lease_id and lease.worker and lease.worker != workers[-1]:
            workers.append(lease.worker)
            _worker_file.write(path, workers)
    for keeper in view.keepers if view is not None else []:
        if keeper.lease.id == lease_id:
            keeper.server = server
    print(
        f"gpuattach: lease {lease_id} moved to {server.url}: the run goes on there",
        file=sys.stderr,
        flush=True,
    )


def _nccl_forwarding(env: dict, *, spread: bool) -> None:
    """NCCL run by the lease's worker (libgpupool_nccl.so preloaded): for --spread runs, or GPUPOOL_NCCL=forward.
    A note, and the program's own NCCL, where the library is not built."""
    from virtualize.client.remote import ShimNotBuilt, nccl_env

    try:
        env.update(nccl_env(env, spread=spread))
    except ShimNotBuilt:
        print("gpuattach: note: gpupool's libgpupool_nccl.so is not built: NCCL runs in the command's processes, "
              "and across servers its transfers go through this machine", file=sys.stderr)  # fmt: skip


def _local_cuda(lease: Lease, env: dict) -> None:
    """Put gpupool's --local interposer first on the command's library path: this host's real
    libcuda.so.1 with cuMemGetInfo / cuDeviceTotalMem answering the partition's size (--local only;
    remote runs get the remote shim). A note, and the real driver alone, where it is not built."""
    try:
        from virtualize.client.remote import ShimNotBuilt, host_libcuda, local_cuda_env
    except ImportError:
        return
    real = host_libcuda(env)
    if real is None:  # no driver here (simulated GPUs): nothing of CUDA's to answer
        return
    try:
        env.update(local_cuda_env(lease, env, real=real))
    except ShimNotBuilt:
        print("gpuattach: note: gpupool's --local libcuda.so.1 is not built: CUDA in the command reports the "
              "whole GPU's memory, not the partition's", file=sys.stderr)  # fmt: skip


def _nvml_view(run: _Run, env: dict, scratch: Path, *, local: bool):
    """The lease's NVML view, kept current while the command runs, with gpupool's libnvidia-ml.so.1
    put first on the command's library path (remote and --local alike), so nvidia-smi, pynvml,
    nvitop and gpustat show the lease's slice; in a --local run this host's own NVML answers the
    other queries (NVLink, clocks, ECC …). None (and a note) where that library is not built."""
    from virtualize.client._nvml_view import VIEW_ENV, ViewKeeper, ViewKeepers

    try:
        from virtualize.client.remote import ShimNotBuilt, host_nvml, nvml_env
    except ImportError:
        return None
    try:
        real = host_nvml(env) if local else None
        # One view per lease: under --spread the process of local rank r shows lease r's GPU
        # (GPUPOOL_NVML_VIEW_r, picked as the CUDA shim picks lease r's worker).
        keepers = []
        for rank, (server, lease) in enumerate(run.leases):
            directory = scratch / f"nvml-{rank}"
            directory.mkdir()
            keepers.append(ViewKeeper(run.client, server, lease, directory, real))
        env.update(nvml_env(keepers[0].path, env))
        if len(keepers) > 1:
            env.update({f"{VIEW_ENV}_{rank}": str(k.path) for rank, k in enumerate(keepers)})
    except ShimNotBuilt:
        print("gpuattach: note: gpupool's libnvidia-ml.so.1 is not built: NVML tools (nvidia-smi, nvitop) "
              "in the command do not show the lease's slice", file=sys.stderr)  # fmt: skip
        return None
    return ViewKeepers(keepers)


def _run_command(args, cmd, run: _Run, env: dict, view) -> int:
    from server.client import Heartbeater, heartbeat_interval

    beats = [
        Heartbeater(run.client, server, answer.id, heartbeat_interval(answer.ttl_s),
                    on_end=functools.partial(run.on_lease_end, lease_id=answer.id),
                    on_moved=functools.partial(_follow_move, run, view, answer.id))
        for server, answer in run.leases
    ]  # fmt: skip
    old = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)}
    tty = _foreground_tty()
    try:
        for s in old:
            signal.signal(s, run.forward)
        try:
            # Its own process group: a signal reaches the command once (from us, or from the terminal
            # when we hand it the foreground), and the whole group can be stopped on a reclaim.
            run.child = subprocess.Popen(cmd, env=env, process_group=0)
        except FileNotFoundError:
            return _fail(f"command not found: {cmd[0]}", "check the command after --", EXIT_NOT_FOUND)
        except PermissionError:
            return _fail(f"cannot execute {cmd[0]}: permission denied", "", EXIT_CANNOT_EXEC)
        if tty is not None:
            _give_foreground(tty, run.child.pid)
        if view is not None:
            view.start([run.child.pid])
        for hb in beats:
            hb.start(pids=[os.getpid(), run.child.pid] if args.local else None)
        if args.local:
            threading.Thread(
                target=_quiet, args=(beats[0].beat_now,), daemon=True
            ).start()  # register the pid now
        rc = run.child.wait()
    finally:
        for hb in beats:
            hb.stop()
        if run._killer:
            run._killer.cancel()
        if tty is not None:
            _give_foreground(tty, os.getpgrp())
        for s, h in old.items():
            signal.signal(s, h)
    return 128 - rc if rc < 0 else rc


def _quiet(fn) -> None:
    with contextlib.suppress(Exception):
        fn()


def _foreground_tty() -> int | None:
    try:
        fd = sys.stdin.fileno()
        if os.isatty(fd) and os.tcgetpgrp(fd) == os.getpgrp():
            return fd
    except (OSError, ValueError):
        pass
    return None


def _give_foreground(fd: int, pgrp: int) -> None:
    old = signal.signal(signal.SIGTTOU, signal.SIG_IGN)  # we may be in the background for a moment
    try:
        os.tcsetpgrp(fd, pgrp)
    except OSError:
        pass
    finally:
        signal.signal(signal.SIGTTOU, old)


if __name__ == "__main__":
    sys.exit(main())
