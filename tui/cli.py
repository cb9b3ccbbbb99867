"""`gpupool-console`: parse options, check them, build the app's parts, run it.

Only argparse and the standard library load before the options are checked, so ``--help`` and
option errors are instant; Textual and DuckDB load when the console really starts.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from collector import durations
from collector.errors import GpupoolError, report_error

TOKEN_ENV = "GPUPOOL_ADMIN_TOKEN"
RANGE_CHOICES = ("1h", "6h", "24h", "7d", "30d", "all")

EPILOG = f"""\
examples:
  gpupool-console --telemetry /var/lib/gpupool/telemetry
  gpupool-console --server http://gpu1:56001 http://gpu2:56001 --admin-token-file ~/.config/gpupool/admin-token
  gpupool-console --telemetry /shared/telemetry --server gpu1:56001 --refresh 5s
  gpupool-console --prometheus http://gpu1:9400/metrics

Views: 1 Fleet (live GPUs from telemetry), 2 Pool (servers, partitions, leases, clients),
3 History (fleet summary, idle holders). Press ? in the console for every key.
The admin token can also come from ${TOKEN_ENV}; without one the pool is shown read-only (health only).
Make one on a GPU host (and import it on the others: docs/console.md, "Starting it"):
  (umask 077; gpupool-server token create ops --admin > ~/.config/gpupool/admin-token)
"""


class UsageError(GpupoolError):
    """The console's errors (its package's root): bad options, one line on stderr, exit status 2."""

    exit_code = 2


@dataclass
class ConsoleOptions:
    telemetry: list[Path] = field(default_factory=list)
    servers: list[str] = field(default_factory=list)
    prometheus: list[str] = field(default_factory=list)
    admin_token: str | None = None
    refresh_s: float = 2.0
    window_s: float = 600.0
    request_timeout_s: float = 3.0
    ca_cert: Path | None = None
    history_range: str = "24h"
    view: str | None = None


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, like every other error of the console
        raise UsageError(message, "see gpupool-console --help")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="gpupool-console",
        description="Terminal ops console for gpupool: live GPUs from telemetry, the pool's servers, "
        "leases and clients, history of idle holders; operator actions with an admin token.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--telemetry",
        metavar="DIR",
        nargs="+",
        action="extend",
        default=[],
        help="telemetry directories written by gpustat-collect (or gpupool-server); repeat or list several",
    )
    p.add_argument(
        "--server",
        metavar="URL",
        nargs="+",
        action="extend",
        default=[],
        help="gpupool-server API URLs (http://host:port or host:port); unreachable ones are shown and retried",
    )
    p.add_argument(
        "--prometheus",
        metavar="URL",
        nargs="+",
        action="extend",
        default=[],
        help="collector /metrics endpoints for the Fleet view, instead of telemetry directories",
    )
    p.add_argument(
        "--admin-token",
        metavar="TOKEN",
        help=f"admin token of the pool servers (default: ${TOKEN_ENV}); needed for leases, clients "
        "and every operator action",
    )
    p.add_argument(
        "--admin-token-file",
        metavar="PATH",
        type=Path,
        help="read the admin token from a file (keeps it out of the process list)",
    )
    p.add_argument(
        "--ca-cert",
        metavar="PATH",
        type=Path,
        help="CA certificate (PEM) to trust for https:// servers signed by a private CA",
    )
    p.add_argument(
        "--refresh",
        metavar="DURATION",
        type=durations.argument(),
        default=2.0,
        help="how often to refresh: 500ms, 2s, 1m (default: 2s)",
    )
    p.add_argument(
        "--window",
        metavar="DURATION",
        type=durations.argument(),
        default=600.0,
        help="how far back the Fleet sparklines reach (default: 10m)",
    )
    p.add_argument(
        "--timeout",
        metavar="DURATION",
        type=durations.argument(),
        default=3.0,
        help="per-request timeout for pool servers (default: 3s)",
    )
    p.add_argument(
        "--history-range",
        choices=RANGE_CHOICES,
        default="24h",
        help="range the History view starts with (default: 24h; change it with [ and ])",
    )
    p.add_argument("--view", choices=("fleet", "pool", "history"), help="view to start in")
    return p


def parse_options(argv: list[str] | None = None, env: Mapping[str, str] | None = None) -> ConsoleOptions:
    """Options from the command line and environment, checked; raises UsageError with a hint."""
    env = os.environ if env is None else env
    args = build_parser().parse_args(argv)
    token = args.admin_token
    if args.admin_token_file is not None:
        if token:
            raise UsageError("give --admin-token or --admin-token-file, not both")
        try:
            token = args.admin_token_file.expanduser().read_text().strip()
        except OSError as exc:
            raise UsageError(
                f"cannot read the admin token file {args.admin_token_file}: {exc.strerror}",
                "check the path and its permissions",
            ) from None
        if not token:
            raise UsageError(f"the admin token file {args.admin_token_file} is empty")
    token = token or env.get(TOKEN_ENV) or None
    if not (args.telemetry or args.server or args.prometheus):
        raise UsageError(
            "nothing to show: no telemetry directory, server or Prometheus endpoint given",
            "try --telemetry DIR and/or --server URL (see --help)",
        )
    if args.telemetry and args.prometheus:
        raise UsageError(
            "give --telemetry or --prometheus for the Fleet view, not both",
            "telemetry directories also give History; Prometheus only the live Fleet",
        )
    from server.client import PoolClientError, normalize_url

    servers = []
    for url in args.server:
        try:
            servers.append(normalize_url(url))
        except PoolClientError as exc:
            raise UsageError(exc.title, exc.hint) from None
    prometheus = []
    for url in args.prometheus:
        try:
            prometheus.append(normalize_url(url, default_port=None))
        except PoolClientError as exc:
            raise UsageError(exc.title.replace("server URL", "Prometheus URL"), exc.hint) from None
    ca_cert = args.ca_cert.expanduser() if args.ca_cert else None
    if ca_cert is not None and not ca_cert.is_file():
        raise UsageError(
            f"CA certificate not found: {ca_cert}", "give the PEM file of the CA that signed the servers"
        )
    for d in args.telemetry:
        if str(d).startswith("s3://"):
            raise UsageError(
                f"the console tails telemetry directories, not buckets: {d}",
                "for a fleet that writes to a bucket, watch its collectors' /metrics "
                "(gpupool-console --prometheus HOST:9401 ...) and build the report from the bucket "
                "(gpustat-report build s3://BUCKET/PREFIX)",
            )
    dirs = [Path(d).expanduser() for d in args.telemetry]
    for d in dirs:
        if not d.is_dir():
            raise UsageError(
                f"telemetry directory not found: {d}",
                "run gpustat-collect --out DIR first, or check the path",
            )
    return ConsoleOptions(
        telemetry=dirs,
        servers=list(dict.fromkeys(servers)),
        prometheus=prometheus,
        admin_token=token,
        refresh_s=args.refresh,
        window_s=args.window,
        request_timeout_s=args.timeout,
        ca_cert=ca_cert,
        history_range=args.history_range,
        view=args.view,
    )


def build_app(options: ConsoleOptions):
    """The console for these options (imports Textual and analytics)."""
    from server.client import ServerClient, ServerClientOptions
    from tui._history import HistorySource
    from tui._sources import FleetSource, Pool, SeriesOptions, TelemetryFleet
    from tui.app import ConsoleApp

    fleet: FleetSource | None = None
    history: HistorySource | None = None
    pool: Pool | None = None
    series = SeriesOptions(minutes=options.window_s / 60)
    if options.telemetry:
        import analytics

        try:  # once, up front: a directory of an unknown schema version is an error, not a blank view
            analytics.open_telemetry(options.telemetry, require_data=False)
        except analytics.TelemetryError as exc:
            raise UsageError(exc.title, exc.hint) from None
        fleet = TelemetryFleet(options.telemetry, series)
        history = HistorySource(options.telemetry)
    elif options.prometheus:
        from tui._prometheus import PrometheusFleet

        fleet = PrometheusFleet(options.prometheus, series, timeout_s=options.request_timeout_s)
    if options.servers:
        ca = str(options.ca_cert) if options.ca_cert else None
        try:
            client_options = ServerClientOptions(timeout_s=options.request_timeout_s, ca_cert=ca)
            clients = [ServerClient(url, options.admin_token, client_options) for url in options.servers]
        except (OSError, ValueError) as exc:  # ssl: a CA file that is not PEM
            raise UsageError(f"cannot use the CA certificate {ca}: {exc}", "give a PEM file") from None
        pool = Pool(clients)
    return ConsoleApp(
        fleet=fleet,
        pool=pool,
        history=history,
        history_range=options.history_range,
        refresh_s=options.refresh_s,
        start_view=options.view,
    )


def main(argv: list[str] | None = None) -> int:
    try:
        options = parse_options(argv)
        try:
            app = build_app(options)
        except ImportError as exc:
            raise UsageError(
                f"gpupool-console cannot start: {exc}", "install the console: pip install 'gpupool[tui]'"
            ) from None
    except UsageError as exc:
        return report_error("gpupool-console", exc)
    app.run()
    return app.return_code or 0


if __name__ == "__main__":
    sys.exit(main())
