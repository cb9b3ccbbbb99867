"""``gpustat-report``: the pre-adoption audit as a Streamlit app or one self-contained HTML file.

    gpustat-report serve telemetry/ [--port 8501]
    gpustat-report build telemetry/ other-host-telemetry/ -o report.html
    gpustat-report rollup telemetry/        # (re)build the minute and hour rollups the report reads

Errors a user can cause (a missing or empty directory, a range with no data, mixed schema versions,
an option out of range, a port in use) print one line on stderr and exit 2, before anything starts;
heavy imports wait until a command runs so ``--help`` is fast.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path

from collector import durations
from collector.argtypes import listen_hint, ranged
from collector.errors import report
from collector.location import is_s3
from reports import DIRS_ENV

EXIT_USAGE = 2
START_TIMEOUT_S = 60.0
MAX_POOL_GPUS = 1_000_000  # above any fleet; the replay itself never uses more GPUs than the peak need


class _Parser(argparse.ArgumentParser):
    """Bad usage is one line and exit 2, like every other error a user can cause."""

    def error(self, message: str):
        sys.exit(report("gpustat-report", message, f"{self.prog} --help", EXIT_USAGE))


def _tz(text: str) -> str:
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    try:
        ZoneInfo(text)
    except (ZoneInfoNotFoundError, ValueError):
        raise argparse.ArgumentTypeError(
            f"unknown time zone {text!r} (an IANA name, e.g. Europe/Berlin or UTC)"
        ) from None
    return text


def _when(text: str) -> datetime:
    """ISO date or date-time; naive means UTC."""
    try:
        ts = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not an ISO date/time: {text!r} (e.g. 2026-03-01 or 2026-03-01T09:00)"
        ) from None
    return ts.replace(tzinfo=UTC) if ts.tzinfo is None else ts


DIRS_HELP = (
    "telemetry directories (one per host, or shared), or s3://BUCKET/PREFIX locations (credentials and "
    "endpoint from AWS_* variables; see docs/report.md)"
)


def _parser() -> argparse.ArgumentParser:
    ap = _Parser(
        prog="gpustat-report",
        description="How busy are the GPUs really, when, who holds them idle, and what would a pool of "
        "fractional GPUs need? Reads telemetry directories (or s3://BUCKET/PREFIX locations) written by "
        "gpustat-collect.",
    )
    sub = ap.add_subparsers(dest="command", required=True, metavar="{serve,build,rollup}")

    serve = sub.add_parser("serve", help="start the interactive report (Streamlit) in a web server")
    serve.add_argument("dirs", nargs="+", metavar="DIR", help=DIRS_HELP)
    serve.add_argument(
        "--port",
        type=ranged(int, 1, 65535, "a port number"),
        default=8501,
        help="port to listen on, 1-65535 (default 8501)",
    )
    serve.add_argument(
        "--address",
        default="127.0.0.1",
        help="address to listen on (default 127.0.0.1; 0.0.0.0 to let colleagues open it)",
    )

    build = sub.add_parser(
        "build", help="write the report as one self-contained HTML file (no network needed)"
    )
    build.add_argument("dirs", nargs="+", metavar="DIR", help=DIRS_HELP)
    build.add_argument(
        "-o",
        "--output",
        type=Path,
        default=Path("report.html"),
        help="file to write, not a directory (report.html)",
    )
    build.add_argument(
        "--start", type=_when, help="first time to include, ISO (UTC unless given); default: all"
    )
    build.add_argument("--end", type=_when, help="time to stop before, ISO (UTC unless given); default: all")
    build.add_argument(
        "--hosts", nargs="+", default=[], metavar="HOST", help="only these hosts (default all)"
    )
    build.add_argument(
        "--idle-below",
        type=ranged(float, 0, 100, "a percentage"),
        default=5.0,
        help="utilization.gpu %% under which a GPU is idle (5)",
    )
    build.add_argument(
        "--held-gib",
        type=ranged(float, 0),
        default=1.0,
        help="memory in use (GiB) that makes an idle GPU 'held' (1)",
    )
    build.add_argument(
        "--tz", type=_tz, default="UTC", help="time zone of the hour-of-week heatmap, IANA name (UTC)"
    )
    build.add_argument(
        "--heatmap",
        choices=["fleet", "host", "gpu"],
        default="fleet",
        help="one heatmap for the fleet, or per host/GPU",
    )
    rollup = sub.add_parser(
        "rollup",
        help="(re)build the per-minute and per-hour rollups of a telemetry directory from its raw samples",
        description=(
            "Pre-aggregate gpu_samples per GPU per minute and per hour (gpu_rollup_1m, gpu_rollup_1h, beside "
            "the raw tables) so the summary over months answers in seconds. Covers each host up to 10 minutes "
            "before its newest sample; the report reads raw samples after that. Safe to interrupt: each "
            "file is replaced atomically. Incremental: each host goes on from its previous mark (--rebuild: "
            "from its oldest raw sample). gpustat-collect keeps them up to date by itself (docs/collector.md)."
        ),
    )
    rollup.add_argument(
        "dir", metavar="DIR", help="telemetry directory (written by gpustat-collect; not a bucket)"
    )
    rollup.add_argument(
        "--hosts", nargs="+", default=[], metavar="HOST", help="only these hosts (default all)"
    )
    rollup.add_argument(
        "--rebuild",
        action="store_true",
        help="recompute from each host's oldest raw sample (default: go on from the previous build's mark)",
    )
    rollup.add_argument(
        "--keep-raw",
        type=durations.argument(positive=False),
        default=None,
        metavar="D",
        help="then delete raw gpu_samples days older than D (e.g. 14d) that the rollups cover (never others)",
    )
    rollup.add_argument("-q", "--quiet", action="store_true", help="print only the summary")
    pool = build.add_argument_group("what-if pool")
    pool.add_argument(
        "--granularity",
        type=ranged(int, 1, 20, "partitions per GPU"),
        default=20,
        help="partitions per GPU, 1-20 (20: 1/20 of a GPU)",
    )
    pool.add_argument(
        "--policy",
        choices=["first-fit", "best-fit", "first-fit-decreasing"],
        default="best-fit",
        help="how requests are packed onto pool GPUs (best-fit)",
    )
    pool.add_argument(
        "--demand",
        choices=["auto", "process", "gpu"],
        default="auto",
        help="replay each process (needs process rows), each GPU's utilization and memory held, or "
        "auto: processes where the telemetry has them, else GPUs (auto)",
    )
    pool.add_argument(
        "--price",
        type=ranged(float, 0),
        default=None,
        help="your price per GPU-hour for the cost comparison, 0 or more (default 2.50, and the report "
        "says it is the default)",
    )
    pool.add_argument(
        "--gpu-memory",
        type=ranged(float, 1, 4096, "GPU memory (GiB)"),
        default=None,
        metavar="GIB",
        help="memory of one pool GPU in GiB, 1-4096 (default: memory.total in the telemetry, else inferred "
        "from the GPU model name; needed where neither is there)",
    )
    pool.add_argument("--currency", default="USD", help="currency label (USD)")
    pool.add_argument(
        "--pool-gpus",
        type=ranged(int, 1, MAX_POOL_GPUS, "a pool size"),
        help=f"pool size to replay with waiting, 1-{MAX_POOL_GPUS:,} GPUs (default: the p95 need)",
    )
    return ap


def _fail(title: str, hint: str = "") -> int:
    return report("gpustat-report", title, hint, EXIT_USAGE)


def _check_port(address: str, port: int) -> tuple[str, str] | None:
    """Why ``address:port`` cannot be listened on and what to do, or None: checked before anything
    says "serving". An address that does not resolve is the address's fault, not the port's."""
    try:
        family, kind, proto, _, where = socket.getaddrinfo(address, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as exc:
        return f"cannot listen on {address}: {exc.strerror}", listen_hint(exc, "--address", "--port")
    with socket.socket(family, kind, proto) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the web server itself does
        try:
            s.bind(where)
        except OSError as exc:
            why = f"cannot listen on {address}:{port}: {exc.strerror or exc}"
            return why, listen_hint(exc, "--address", "--port")
    return None


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def _ensure_rollups(dirs: list[str]) -> None:
    """Say, in one line, which hosts have raw samples but no rollups (every figure would read them raw:
    slow), and build them in each directory that takes them; where one does not, say the command."""
    import analytics
    from collector import build_rollups

    slow = analytics.unrolled_hosts(analytics.open_telemetry(dirs))
    if not slow:
        return
    hosts = tuple(sorted(slow))
    print(
        f"gpustat-report: {len(hosts)} host(s) without rollups ({sum(slow.values()):,} raw samples): "
        "building them now, once (gpustat-report rollup DIR)",
        file=sys.stderr,
        flush=True,
    )
    for d in dirs:
        if is_s3(d):
            continue
        try:
            build_rollups(d, hosts=hosts)
        except (OSError, analytics.TelemetryError) as exc:
            why = exc.title if isinstance(exc, analytics.TelemetryError) else (exc.strerror or exc)
            print(
                f"gpustat-report: warning: rollups not built in {d} ({why}); the report reads raw "
                f"samples (slow): run gpustat-report rollup {d} where it can write",
                file=sys.stderr,
                flush=True,
            )


def _serve(args) -> int:
    import analytics

    analytics.data_extent(analytics.open_telemetry(args.dirs))  # fail here, in one line, not in the browser
    _ensure_rollups(args.dirs)
    refusal = _check_port(args.address, args.port)
    if refusal:
        return _fail(*refusal)
    env = dict(os.environ)
    env[DIRS_ENV] = os.pathsep.join(d if is_s3(d) else str(Path(d).resolve()) for d in args.dirs)
    app = Path(__file__).with_name("app.py")  # not imported here: Streamlit warns outside its runtime
    cmd = [sys.executable, "-m", "streamlit", "run", str(app), "--server.port", str(args.port),
           "--server.address", args.address, "--server.headless", "true", "--browser.gatherUsageStats", "false",
           "--client.toolbarMode", "minimal", "--logger.level", "warning"]  # fmt: skip
    # Streamlit's own "you can now view" lines go to /dev/null; its errors and logs stay on stderr.
    child = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL)
    stopping = []

    def forward(signum, _frame) -> None:
        stopping.append(signum)
        if child.poll() is None:
            child.send_signal(signum)

    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, forward)
    probe = (
        "127.0.0.1" if args.address in ("0.0.0.0", "") else ("::1" if args.address == "::" else args.address)
    )
    host = f"[{probe}]" if ":" in probe else probe
    deadline = time.monotonic() + START_TIMEOUT_S
    while not _healthy(f"http://{host}:{args.port}/_stcore/health"):
        if child.poll() is not None or stopping:
            break
        if time.monotonic() > deadline:
            child.terminate()
            break
        time.sleep(0.2)
    else:
        shown = f"[{args.address}]" if ":" in args.address else args.address
        print(
            f"gpustat-report: serving http://{shown}:{args.port} (Ctrl-C to stop)",
            file=sys.stderr,
            flush=True,
        )
    rc = child.wait()
    if stopping:
        return 0
    if rc != 0:
        return _fail(f"the report server stopped (status {rc}); its messages are above")
    return rc


def _build(args) -> int:
    import analytics
    from reports._html import BuildOptions, write_html

    opts = BuildOptions(
        scope=analytics.Scope(args.start, args.end, tuple(args.hosts)),
        summary=analytics.SummaryOptions(
            idle_below=args.idle_below / 100, held_mem_bytes=int(args.held_gib * (1 << 30))
        ),
        pool=analytics.PoolOptions(
            granularity=args.granularity,
            policy=args.policy,
            demand=args.demand,
            price_per_gpu_hour=args.price,
            gpu_mem_bytes=None if args.gpu_memory is None else int(args.gpu_memory * (1 << 30)),
            currency=args.currency,
            pool_gpus=args.pool_gpus,
            held_mem_bytes=int(args.held_gib * (1 << 30)),
            idle_below=args.idle_below / 100,
        ),
        tz=args.tz,
        heatmap_level=args.heatmap,
    )
    if args.output.parent and not args.output.parent.is_dir():
        return _fail(f"output folder does not exist: {args.output.parent}", "create it or choose another -o")
    if args.output.is_dir():
        return _fail(
            f"-o {args.output} is a directory",
            f"name the file to write, e.g. -o {args.output / 'report.html'}",
        )
    if not os.access(args.output.parent, os.W_OK):
        return _fail(f"cannot write into {args.output.parent}", "choose another -o")
    _ensure_rollups(args.dirs)
    try:
        out = write_html(
            args.dirs,
            args.output,
            opts,
            progress=lambda msg: print(f"gpustat-report: {msg}...", file=sys.stderr),
        )
    except OSError as exc:
        return _fail(f"cannot write {args.output}: {exc.strerror or exc}", "free space or choose another -o")
    print(f"gpustat-report: wrote {out}", file=sys.stderr)
    return 0


def _rollup(args) -> int:
    from collector import build_rollups, expire_raw

    if is_s3(args.dir):
        return _fail(
            f"rollups are built in a telemetry directory, not in a bucket: {args.dir}",
            "the report reads a bucket's raw samples; for rollups copy it to a directory (aws s3 sync) "
            "and run gpustat-report rollup DIR there",
        )
    t0 = time.monotonic()
    try:
        result = build_rollups(
            args.dir,
            hosts=tuple(args.hosts),
            rebuild=args.rebuild,
            progress=None
            if args.quiet
            else lambda msg: print(f"gpustat-report: rollup {msg}", file=sys.stderr),
        )
        gone = None
        if args.keep_raw is not None:
            gone = expire_raw(args.dir, args.keep_raw, hosts=tuple(args.hosts))
    except OSError as exc:
        return _fail(
            f"rollup failed under {args.dir}: {exc.strerror or exc}",
            "readers stay consistent (each file is replaced whole); fix the cause and run it again",
        )
    print(
        f"gpustat-report: rolled up {result.samples:,} samples of {result.hosts} host(s) into "
        f"{result.minute_rows:,} minute rows, {result.hour_rows:,} hour rows and {result.day_rows:,} day rows "
        f"({result.files} files) "
        f"in {time.monotonic() - t0:.1f} s"
    )
    if gone is not None:
        print(
            f"gpustat-report: expired {gone.partitions} raw day partition(s) ({gone.bytes / (1 << 20):,.0f} MiB); "
            f"{len(gone.kept_no_rollup)} older one(s) kept: no rollup covers them yet"
        )
    return 0


def _log_warnings() -> None:
    # Readers warn through logging (a damaged segment left out): one line each, under our name.
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("gpustat-report: warning: %(message)s"))
    logger = logging.getLogger("gpupool")
    logger.addHandler(handler)
    logger.setLevel(logging.WARNING)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    _log_warnings()
    from analytics import TelemetryError

    try:
        if args.command == "rollup":
            return _rollup(args)
        return _serve(args) if args.command == "serve" else _build(args)
    except TelemetryError as exc:
        return _fail(exc.title, exc.hint)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
