"""`gpustat-collect`: sample GPUs into telemetry; import nvidia-smi / dcgm logs; compact segments.

Heavy modules (pyarrow, numpy, pynvml, prometheus_client) are imported inside the commands, so
``--help`` stays fast.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import signal
import sys
import threading
from pathlib import Path

from collector import durations
from collector.argtypes import ranged
from collector.errors import GpupoolError, report
from collector.words import plural

GPU_COUNT = ranged(int, 1, 4096, "a number of GPUs")

PROG = "gpustat-collect"


DURATION = durations.argument()  # an interval, a span: more than zero
PERIOD = durations.argument(positive=False)  # a period where 0 means never


def parse_backfill(text: str) -> float:
    """An argparse type: a span of simulated history ending now that starts within the schema's time
    range (``collector.schema.TS_RANGE``: no sample is older)."""
    from collector.schema import TS_RANGE

    value = DURATION(text)
    longest = (dt.datetime.now(dt.UTC) - TS_RANGE[0]).total_seconds()
    if value > longest:
        raise argparse.ArgumentTypeError(
            f"{text} is out of range: history starts in {TS_RANGE[0].year} at the earliest "
            f"(at most {longest // 86400:.0f}d)"
        )
    return value


def default_out() -> Path:
    """<user data dir>/gpupool/telemetry (platformdirs; the XDG default where it is not installed)."""
    try:
        from platformdirs import user_data_dir
    except ImportError:  # a bare GPU host: follow the XDG rule platformdirs applies on Linux
        base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
        return Path(base) / "gpupool" / "telemetry"
    return Path(user_data_dir("gpupool")) / "telemetry"


def default_spool() -> Path:
    """<user data dir>/gpupool/spool: rows an object store did not take by exit, sent at the next start."""
    return default_out().parent / "spool"


class _Parser(argparse.ArgumentParser):
    """Bad usage is one line and exit 2, like every other error a user can cause."""

    def error(self, message: str):
        sys.exit(report(PROG, message, f"see {self.prog} --help", 2))


def _keep_raw_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--keep-raw",
        type=DURATION,
        default=None,
        metavar="D",
        help=(
            "delete raw gpu_samples days older than D (e.g. 14d) once the rollups cover them; days no rollup "
            "covers yet are kept, and so are process_samples (default: keep everything)"
        ),
    )


def _err(title: str, hint: str = "") -> int:
    return report(PROG, title, hint, 2)


# -- collect ------------------------------------------------------------------------------------------
def collect_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog=PROG,
        description=(
            "Sample every GPU of this host (NVML) into Parquet telemetry segments that DuckDB reads: "
            "utilization (driver sample ring, mean and max per tick), memory, power, energy, temperature, "
            "SM clock, GPM SM activity/occupancy/tensor/DRAM on Hopper+, and per-process memory, busy "
            "share, user and container."
        ),
        epilog=(
            "other commands:\n"
            f"  {PROG} import nvidia-smi FILE... --out DIR [--host H]   import nvidia-smi --query-gpu CSV logs\n"
            f"  {PROG} import dcgm FILE... --out DIR [--host H]         import dcgm-exporter /metrics dumps\n"
            f"  {PROG} compact DIR [--date D] [--keep-raw 14d]          merge a day's small segments, update rollups\n"
            "\nexamples:\n"
            f"  {PROG} --out /var/lib/gpupool/telemetry --prometheus 9401\n"
            f"  {PROG} --simulate 8 --duration 10m          # no GPU here: a labelled simulated fleet\n"
            f"  {PROG} --out s3://telemetry/fleet           # a fleet's shared bucket (AWS_* variables)\n"
            f"  {PROG} --fallback-simulate 8 --backfill 7d --duration 60\n"
            "\ndurations: 500ms, 1s, 10m, 2h, 7d (a plain number is seconds)"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--out",
        metavar="DIR|s3://BUCKET/PREFIX",
        help=f"telemetry directory, or an S3-compatible bucket (credentials and endpoint from AWS_* "
        f"variables; see docs/collector.md) (default: {default_out()})",
    )
    p.add_argument(
        "--spool",
        type=Path,
        metavar="DIR",
        help="with --out s3://: where rows the bucket did not take by exit are kept, and sent from at the "
        f"next start (default: {default_spool()})",
    )
    p.add_argument(
        "--interval", type=DURATION, default=1.0, metavar="D", help="time between samples (default 1s)"
    )
    p.add_argument(
        "--duration", type=DURATION, metavar="D", help="stop after this long (default: until Ctrl-C)"
    )
    p.add_argument(
        "--flush",
        type=DURATION,
        default=10.0,
        metavar="D",
        help="write buffered samples this often; a crash loses at most this much (default 10s)",
    )
    src = p.add_mutually_exclusive_group()
    src.add_argument(
        "--simulate", type=GPU_COUNT, metavar="N", help="sample a SIMULATED fleet of N GPUs, not NVML"
    )
    src.add_argument(
        "--replay", type=Path, metavar="DIR", help="re-emit recorded telemetry from DIR (source='replay')"
    )
    src.add_argument(
        "--fallback-simulate",
        type=GPU_COUNT,
        metavar="N",
        help="use NVML if it starts, else say so and simulate N GPUs",
    )
    p.add_argument(
        "--replay-speed", type=float, default=1.0, metavar="X", help="replay X times faster (default 1)"
    )
    p.add_argument("--replay-host", metavar="NAME", help="which host of a multi-host recording to replay")
    p.add_argument(
        "--backfill",
        type=parse_backfill,
        metavar="D",
        help="simulated fleet only: first write D of simulated history ending now (e.g. 7d)",
    )
    p.add_argument(
        "--backfill-step",
        type=DURATION,
        default=10.0,
        metavar="D",
        help="time between backfilled samples (default 10s)",
    )
    p.add_argument("--seed", type=int, default=7, help="simulated fleet: seed of its patterns (default 7)")
    p.add_argument(
        "--prometheus",
        type=ranged(int, 0, 65535, "a port number"),
        metavar="PORT",
        help="also serve /metrics on PORT (0: any free port)",
    )
    p.add_argument(
        "--prometheus-addr", default="0.0.0.0", metavar="ADDR", help="address for /metrics (default 0.0.0.0)"
    )
    p.add_argument(
        "--host", default=None, metavar="NAME", help="host name in the telemetry path (default: this host's)"
    )
    p.add_argument(
        "--rollup-every",
        type=PERIOD,
        default=3600.0,
        metavar="D",
        help="bring this host's minute and hour rollups up to date this often (default 1h; 0: never)",
    )
    _keep_raw_option(p)
    p.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="no status line or log lines (errors and lost GPUs still print)",
    )
    p.set_defaults(out=None)
    return p


def _banner(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _simulated_banner(n: int) -> None:
    _banner(
        f"*** SIMULATED FLEET: {n} simulated GPUs — NOT real measurements. "
        "Every row is written with simulated=true, source='simulated'. ***"
    )


def _open_source(args):
    """(source, fleet or None) for the options given; raises CollectorError subclasses."""
    from collector._errors import InputError, NvmlUnavailable

    if args.replay is not None:
        from collector._replay import ReplaySource

        if args.backfill:
            raise InputError("--backfill writes simulated history", "it cannot be combined with --replay")
        source = ReplaySource(args.replay, speed=args.replay_speed, host=args.replay_host)
        if source.simulated:
            _banner("*** REPLAY of SIMULATED telemetry: rows keep simulated=true. ***")
        return source, None
    n = args.simulate
    if n is None:
        try:
            from collector._nvml_source import NvmlSource

            source = NvmlSource(interval_s=args.interval)
        except NvmlUnavailable as exc:
            if args.fallback_simulate is None:
                raise
            n = args.fallback_simulate
            _banner(
                f"notice: {exc.title}; --fallback-simulate: collecting a SIMULATED fleet of {plural(n, 'GPU')} instead"
            )
        else:
            if args.backfill:
                if args.fallback_simulate is None:
                    raise InputError(
                        "--backfill writes simulated history and this host has real GPUs (NVML started)",
                        "drop --backfill, or use --simulate N to build a simulated dataset",
                    )
                _banner(
                    "notice: NVML started: sampling the real GPUs; --backfill applies to a simulated fleet only, skipped"
                )
            return source, None
    from collector._simulated import SimulatedFleet

    _simulated_banner(n)
    return None, SimulatedFleet(n, args.host, seed=args.seed)


def _install_signals(stop: threading.Event) -> None:
    def handler(signum, frame):
        stop.set()

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)


def cmd_collect(argv: list[str]) -> int:
    args = collect_parser().parse_args(argv)
    from collector._errors import CollectorError
    from collector.writer import default_host

    args.host = args.host or default_host()
    args.spool = args.spool or default_spool()
    stop = threading.Event()
    _install_signals(stop)
    try:
        from collector.location import parse_location

        args.out = parse_location(args.out or default_out())
        return _collect(args, stop)
    except CollectorError as exc:
        return _err(exc.title, exc.hint)


def _collect(args, stop: threading.Event) -> int:
    from collector._compact import recover
    from collector._errors import TelemetryWriteError
    from collector._prometheus import LiveState, serve
    from collector._run import RunOptions, Status, run
    from collector.location import S3Location
    from collector.writer import TelemetryWriter, check_host

    check_host(args.host)
    source, fleet = _open_source(args)
    # A bucket that is missing, refuses the credentials or does not answer stops the run here, in
    # one line, before anything is sampled (so nothing is lost).
    writer = TelemetryWriter(args.out, args.host, flush_interval_s=args.flush)
    if isinstance(args.out, S3Location):
        sent = writer.upload_spool(args.spool) if args.spool.is_dir() else 0
        if sent and not args.quiet:
            _banner(
                f"{PROG}: sent {plural(sent, 'segment')} kept in {args.spool} by an earlier run to {args.out}"
            )
    else:
        recover(args.out)
    keeper = None
    status = Status(
        quiet=args.quiet, label=" [SIMULATED]" if (fleet or getattr(source, "simulated", False)) else ""
    )
    try:
        if fleet is not None:
            from collector._simulated_source import SimulatedSource

            energy = None
            if args.backfill:
                energy = _backfill(fleet, writer, args, stop)
            source = SimulatedSource(fleet, energy_start_j=energy)
        for index in getattr(source, "unanswered", []):
            status.event(f"GPU {index} did not answer NVML at start (lost?): not sampled")
        state = LiveState(args.host, source.kind, source.simulated, args.interval)
        gpus = source.inventory()
        if not args.quiet:
            names = ", ".join(sorted({g.name for g in gpus})) or "none"
            _banner(
                f"{PROG}: {plural(len(gpus), 'GPU')} ({names}) via {source.kind} -> {args.out} (host={args.host})"
            )
        if args.prometheus is not None:
            server = serve(state, args.prometheus, args.prometheus_addr)
            if not args.quiet:
                _banner(
                    f"{PROG}: serving /metrics on http://{args.prometheus_addr}:{server.server_address[1]}/metrics"
                )
        stats = None
        if args.rollup_every > 0 and not isinstance(args.out, S3Location):  # a bucket's rollups: elsewhere
            from collector._rollup_keeper import RollupKeeper, RollupOptions

            keeper = RollupKeeper(
                args.out, args.host, RollupOptions(args.rollup_every, args.keep_raw), report=status.event
            ).start()
        if not stop.is_set():
            stats = run(
                source,
                writer,
                RunOptions(args.interval, args.duration),
                stop=stop,
                state=state,
                status=status,
            )
    except TelemetryWriteError as exc:
        status.finish()
        return _err(exc.title, _dropped(exc, writer))
    finally:
        if keeper is not None:
            keeper.stop()
        if source is not None:
            source.close()
    status.finish()
    failed = None
    try:
        writer.close()
    except TelemetryWriteError as exc:
        if not writer.keeps_rows_on_error:  # a directory still full or unwritable at exit
            return _err(exc.title, _dropped(exc, writer))
        failed = exc
        spilled = writer.spill(args.spool)  # raises TelemetryWriteError -> one line from cmd_collect
    if not args.quiet:
        ticks = stats.ticks if stats else 0
        _banner(
            f"{PROG}: stopped after {plural(ticks, 'tick')}; {plural(writer.rows_written, 'row')} in {plural(writer.segments_written, 'segment')} under {args.out}"
        )
    if failed is not None:
        return _err(
            failed.title,
            f"{plural(spilled, 'row')} kept in {args.spool}; the next gpustat-collect --out {args.out} sends them",
        )
    return 0


def _dropped(exc, writer) -> str:
    """The hint of a write error that ends the run, with what it costs: the rows never written."""
    lost = writer.buffered_rows
    return f"{exc.hint} ({plural(lost, 'unwritten row')} dropped at exit)" if lost else exc.hint


def _newest_sample(root, host: str, since: dt.datetime) -> dt.datetime | None:
    """The newest gpu_samples timestamp of ``host`` under ``root`` (a directory or a bucket location)
    from ``since`` on, or None."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq
    from pyarrow.fs import FileSelector, FileType

    from collector._errors import TelemetryWriteError
    from collector.location import S3Location, describe_s3_error, filesystem

    fs, base = filesystem(root)

    def listing(path: str, kind: FileType) -> list:
        try:
            found = fs.get_file_info(FileSelector(path, allow_not_found=True))
        except OSError as exc:
            if not isinstance(root, S3Location):
                raise
            problem = describe_s3_error(exc, root, reading=True)
            raise TelemetryWriteError(
                f"--backfill reads what {root} holds of {host} first: {problem.title}", problem.hint
            ) from None
        return [f for f in found if f.type == kind and not f.base_name.startswith(".")]

    newest = None
    days = listing(f"{base}/gpu_samples", FileType.Directory)
    for day in sorted(
        (d for d in days if d.base_name.startswith("date=")), key=lambda d: d.base_name, reverse=True
    ):
        if day.base_name[5:] < since.date().isoformat():
            break
        for seg in listing(f"{day.path}/host={host}", FileType.File):
            if not seg.base_name.endswith(".parquet"):
                continue
            try:
                ts = pc.max(pq.read_table(seg.path, columns=["ts"], filesystem=fs).column("ts")).as_py()
            except Exception:  # a damaged segment: the readers skip it too
                continue
            if ts is not None:
                ts = ts if ts.tzinfo else ts.replace(tzinfo=dt.UTC)
                newest = ts if newest is None else max(newest, ts)
        if newest is not None:
            return newest
    return newest


def _backfill(fleet, writer, args, stop: threading.Event) -> list[float] | None:
    from collector._simulated_source import backfill

    end = dt.datetime.now(dt.UTC)
    start = end - dt.timedelta(seconds=args.backfill)
    # Running the same command again must not write the history twice: start after what is there.
    newest = _newest_sample(args.out, args.host, start)
    if newest is not None:
        resume = newest + dt.timedelta(seconds=args.backfill_step)
        if resume >= end - dt.timedelta(seconds=args.backfill_step):
            if not args.quiet:
                _banner(
                    f"{PROG}: {args.out} already holds samples of {args.host} up to {newest:%Y-%m-%d %H:%M} UTC; no backfill needed"
                )
            return None
        if not args.quiet:
            _banner(
                f"{PROG}: {args.out} already holds samples of {args.host} up to {newest:%Y-%m-%d %H:%M} UTC; backfilling only after them"
            )
        start = max(start, resume)
    days = (end - start).total_seconds() / 86400
    if not args.quiet:
        _banner(
            f"{PROG}: backfilling {days:.1f} days of SIMULATED history ({plural(fleet.n, 'GPU')}, one sample per {args.backfill_step:g} s)"
        )

    def progress(upto: dt.datetime) -> None:
        if not args.quiet:
            _banner(f"{PROG}: backfilled up to {upto:%Y-%m-%d %H:%M} UTC")

    return backfill(
        fleet,
        writer.write_table,
        start,
        end,
        step_s=args.backfill_step,
        progress=progress,
        should_stop=stop.is_set,
    )


# -- import -------------------------------------------------------------------------------------------
def import_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog=f"{PROG} import",
        description=(
            "Import logs you already have into gpupool telemetry (same schema, source column says which). "
            "Rows that do not parse, or hold a value outside its column's physical range (999999 %, "
            "-300 C, NaN, year 9999), are skipped and counted with the first reason; a sample already "
            "read or stored is kept once; where a GPU's clock steps back within a file, the samples after "
            "the step are placed after their predecessors, each counted once, and the step is said and "
            "recorded for the report; a failed import leaves nothing written (docs/collector.md)."
        ),
    )
    sub = p.add_subparsers(dest="format", required=True, metavar="FORMAT")
    smi = sub.add_parser(
        "nvidia-smi",
        help="CSV from nvidia-smi --query-gpu=... --format=csv[,nounits] [-l N]",
        description=(
            "Import CSV written by `nvidia-smi --query-gpu=timestamp,index,uuid,name,utilization.gpu,"
            "utilization.memory,memory.used,memory.total,power.draw,temperature.gpu,clocks.sm --format=csv -l 1`. "
            "Needs a header line and a timestamp column; units are optional; [N/A] and [Not Supported] become null."
        ),
    )
    dcgm = sub.add_parser(
        "dcgm",
        help="text dumps of a dcgm-exporter /metrics page",
        description=(
            "Import text dumps of a dcgm-exporter /metrics page (e.g. curl -s host:9400/metrics > dump.txt). "
            "A sample's timestamp is used when present, else the file's modification time."
        ),
    )
    for q, what, host_default in (
        (smi, "nvidia-smi CSV log files", "this host's name"),
        (dcgm, "dcgm-exporter /metrics text dumps", "the Hostname label, else this host's name"),
    ):
        q.add_argument("files", nargs="+", type=Path, metavar="FILE", help=what)
        q.add_argument(
            "--out",
            required=True,
            metavar="DIR|s3://BUCKET/PREFIX",
            help="telemetry directory (or bucket) to write",
        )
        q.add_argument("--host", metavar="NAME", help=f"host the logs come from (default: {host_default})")
        q.add_argument(
            "--no-rollups",
            action="store_true",
            help="do not bring the imported hosts' minute and hour rollups up to date afterwards",
        )
    smi.add_argument(
        "--tz", default=None, metavar="ZONE", help="time zone of the timestamps (default: this machine's)"
    )
    dcgm.add_argument(
        "--interval",
        type=DURATION,
        default=None,
        metavar="D",
        help="several scrapes in one file without timestamps: time between them (ending at the file's mtime)",
    )
    return p


def cmd_import(argv: list[str]) -> int:
    args = import_parser().parse_args(argv)
    from collector._errors import CollectorError

    try:
        if args.format == "nvidia-smi":
            from collector._import_smi import import_files
            from collector.writer import default_host

            report = import_files(args.files, args.out, host=args.host or default_host(), tz=args.tz)
        else:
            from collector._import_dcgm import import_files

            report = import_files(args.files, args.out, host=args.host, interval_s=args.interval)
    except CollectorError as exc:
        return _err(exc.title, exc.hint)
    print(report.summary())
    if report.rows == 0:  # nothing new: fine where all of it was stored before, else nothing usable
        return 0 if report.duplicates else 1
    from collector.location import is_s3

    if not args.no_rollups and not is_s3(str(args.out)):  # a bucket's rollups are built elsewhere
        return _update_rollups(args.out, tuple(sorted(report.hosts)), since=report.first_ts)
    return 0


def _update_rollups(root: Path, hosts: tuple[str, ...] = (), *, keep_raw_s=None, since=None) -> int:
    from collector._rollup_keeper import update

    try:
        print(update(root, hosts, keep_raw_s=keep_raw_s, since=since))
    except OSError as exc:
        return _err(
            f"rollups not updated under {root}: {exc.strerror or exc}",
            "the raw samples are all there; fix the cause and run gpustat-collect compact DIR (or gpustat-report rollup DIR)",
        )
    except GpupoolError as exc:  # the reader's TelemetryError: one line, never a traceback
        return _err(f"rollups not updated: {exc.title}", exc.hint)
    return 0


# -- compact ------------------------------------------------------------------------------------------
def compact_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog=f"{PROG} compact",
        description=(
            "Merge each day's small segments (one per flush) into one segment per table and host. Safe "
            "against crashes (journaled) and while a collector writes. Default: every day before today."
        ),
    )
    p.add_argument("dir", metavar="DIR", help="telemetry directory (not a bucket)")
    p.add_argument(
        "--date",
        type=dt.date.fromisoformat,
        metavar="YYYY-MM-DD",
        help="compact only this day (today allowed)",
    )
    p.add_argument(
        "--no-rollups",
        action="store_true",
        help="only merge segments; do not bring the minute and hour rollups up to date",
    )
    _keep_raw_option(p)
    p.add_argument("-q", "--quiet", action="store_true", help="print only the summary")
    return p


def cmd_compact(argv: list[str]) -> int:
    args = compact_parser().parse_args(argv)
    from collector.location import is_s3

    if is_s3(args.dir):
        return _err(
            f"compaction works on a telemetry directory, not a bucket: {args.dir}",
            "objects in a bucket are written whole and never merged; readers take the many small ones as they are",
        )
    args.dir = Path(args.dir)
    if not args.dir.is_dir():
        return _err(
            f"telemetry directory not found: {args.dir}", "pass the directory gpustat-collect --out wrote"
        )
    from collector._compact import compact

    def progress(folder: Path, n_in: int, rows: int) -> None:
        if not args.quiet:
            print(
                f"compacted {folder.relative_to(args.dir)}: {plural(n_in, 'segment')} -> 1 ({plural(rows, 'row')})"
            )

    try:
        result = compact(args.dir, date=args.date, before=dt.datetime.now(dt.UTC).date(), progress=progress)
    except OSError as exc:
        return _err(
            f"compaction failed under {args.dir}: {exc.strerror or exc}",
            "nothing was lost; fix the cause and run it again",
        )
    extra = f", finished {result.recovered} interrupted compaction(s)" if result.recovered else ""
    for why in result.skipped:
        print(f"skipped {why}", file=sys.stderr)
    for where, why in result.moved_aside:
        print(f"{PROG}: warning: damaged segment moved aside to {where} ({why})", file=sys.stderr)
    print(
        f"compacted {plural(result.folders, 'partition')}: {plural(result.segments_in, 'segment')} -> {result.segments_out} ({plural(result.rows, 'row')}){extra}"
    )
    if args.no_rollups:
        return 0
    if not any((args.dir / "gpu_samples").glob("date=*/host=*")):
        return 0  # no GPU samples (only pool events, say): nothing to roll up
    return _update_rollups(args.dir, keep_raw_s=args.keep_raw)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv and argv[0] == "import":
            return cmd_import(argv[1:])
        if argv and argv[0] == "compact":
            return cmd_compact(argv[1:])
        return cmd_collect(argv)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
