"""``gpustat-report``: the pre-adoption audit as a Streamlit app or one self-contained HTML file.

    gpustat-report serve telemetry/ [--port 8501]
    gpustat-report build telemetry/ other-host-telemetry/ -o report.html

Errors a user can cause (a missing or empty directory, a range with no data, mixed schema versions)
print one line on stderr and exit 2; heavy imports wait until a command runs so ``--help`` is fast.
"""

from __future__ import annotations

import argparse
import os
import sys
from datetime import UTC, datetime
from pathlib import Path

EXIT_USAGE = 2


def _when(text: str) -> datetime:
    """ISO date or date-time; naive means UTC."""
    try:
        ts = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not an ISO date/time: {text!r} (e.g. 2026-03-01 or 2026-03-01T09:00)"
        ) from None
    return ts.replace(tzinfo=UTC) if ts.tzinfo is None else ts


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="gpustat-report",
        description="How busy are the GPUs really, when, who holds them idle, and what would a pool of "
        "fractional GPUs need? Reads telemetry directories written by gpustat-collect.",
    )
    sub = ap.add_subparsers(dest="command", required=True, metavar="{serve,build}")

    serve = sub.add_parser("serve", help="start the interactive report (Streamlit) in a web server")
    serve.add_argument(
        "dirs", nargs="+", metavar="DIR", help="telemetry directories (one per host, or shared)"
    )
    serve.add_argument("--port", type=int, default=8501, help="port to listen on (default 8501)")
    serve.add_argument(
        "--address",
        default="127.0.0.1",
        help="address to listen on (default 127.0.0.1; 0.0.0.0 to let colleagues open it)",
    )

    build = sub.add_parser(
        "build", help="write the report as one self-contained HTML file (no network needed)"
    )
    build.add_argument(
        "dirs", nargs="+", metavar="DIR", help="telemetry directories (one per host, or shared)"
    )
    build.add_argument(
        "-o", "--output", type=Path, default=Path("report.html"), help="file to write (report.html)"
    )
    build.add_argument(
        "--start", type=_when, help="first time to include, ISO (UTC unless given); default: all"
    )
    build.add_argument("--end", type=_when, help="time to stop before, ISO (UTC unless given); default: all")
    build.add_argument(
        "--hosts", nargs="+", default=[], metavar="HOST", help="only these hosts (default all)"
    )
    build.add_argument(
        "--idle-below", type=float, default=5.0, help="utilization.gpu %% under which a GPU is idle (5)"
    )
    build.add_argument(
        "--held-gib", type=float, default=1.0, help="memory in use (GiB) that makes an idle GPU 'held' (1)"
    )
    build.add_argument("--tz", default="UTC", help="time zone of the hour-of-week heatmap, IANA name (UTC)")
    build.add_argument(
        "--heatmap",
        choices=["fleet", "host", "gpu"],
        default="fleet",
        help="one heatmap for the fleet, or per host/GPU",
    )
    pool = build.add_argument_group("what-if pool")
    pool.add_argument(
        "--granularity", type=int, default=20, help="partitions per GPU, 1-20 (20: 1/20 of a GPU)"
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
        "--price", type=float, default=2.50, help="price per GPU-hour for the cost comparison (2.50)"
    )
    pool.add_argument("--currency", default="USD", help="currency label (USD)")
    pool.add_argument(
        "--pool-gpus", type=int, help="pool size to replay with waiting (default: the p95 need)"
    )
    return ap


def _fail(title: str, hint: str = "") -> int:
    print(f"gpustat-report: error: {title}" + (f" (hint: {hint})" if hint else ""), file=sys.stderr)
    return EXIT_USAGE


def _serve(args) -> int:
    import analytics

    analytics.data_extent(analytics.open_telemetry(args.dirs))  # fail here, in one line, not in the browser
    from reports import app

    env = dict(os.environ)
    env[app.DIRS_ENV] = os.pathsep.join(str(Path(d).resolve()) for d in args.dirs)
    cmd = [
        sys.executable,
        "-m",
        "streamlit",
        "run",
        app.__file__,
        "--server.port",
        str(args.port),
        "--server.address",
        args.address,
        "--server.headless",
        "true",
        "--browser.gatherUsageStats",
        "false",
        "--client.toolbarMode",
        "minimal",
    ]
    print(
        f"gpustat-report: serving http://{args.address}:{args.port} (Ctrl-C to stop)",
        file=sys.stderr,
        flush=True,
    )
    os.execve(sys.executable, cmd, env)  # the server replaces this process: signals reach it directly
    return 0  # pragma: no cover


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
    out = write_html(
        args.dirs, args.output, opts, progress=lambda msg: print(f"gpustat-report: {msg}...", file=sys.stderr)
    )
    print(f"gpustat-report: wrote {out}", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from analytics import TelemetryError

    try:
        return _serve(args) if args.command == "serve" else _build(args)
    except TelemetryError as exc:
        return _fail(exc.title, exc.hint)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
