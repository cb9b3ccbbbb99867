"""Rollups kept up to date where telemetry is written: by the collector run, ``compact``, ``import``
and the pool server's sampler.

The rollups themselves are built by ``collector.rollups`` (imported only when a build runs, so
``gpustat-collect --help`` stays fast): incremental, on from each host's previous mark, so a build
every hour reads about an hour of raw samples. ``keep_raw_s`` then expires the raw ``gpu_samples``
days older than that which the rollups cover (never a day they do not cover yet).
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from collector.errors import GpupoolError
from collector.words import plural

log = logging.getLogger("gpupool.collector")

DEFAULT_EVERY_S = 3600.0


@dataclass(frozen=True)
class RollupOptions:
    """When to bring the rollups up to date and how long to keep raw samples (None: for ever)."""

    every_s: float = DEFAULT_EVERY_S  # 0: never (the collector run and the server)
    keep_raw_s: float | None = None


def update(
    root: str | Path,
    hosts: Iterable[str] = (),
    *,
    keep_raw_s: float | None = None,
    since: dt.datetime | None = None,
    progress: Callable[[str], None] | None = None,
) -> str:
    """Bring the rollups of ``hosts`` (all: empty) under ``root`` up to date, then expire raw days
    older than ``keep_raw_s`` that they cover; returns one line saying what was done."""
    from collector.rollups import build_rollups, expire_raw

    hosts = tuple(hosts)
    built = build_rollups(root, hosts=hosts, since=since, progress=progress)
    text = (
        f"rollups: {plural(built.samples, 'sample')} of {plural(built.hosts, 'host')} rolled up "
        f"({built.minute_rows:,} minute rows, {built.hour_rows:,} hour rows, {built.day_rows:,} day rows)"
    )
    if keep_raw_s is not None:
        gone = expire_raw(root, keep_raw_s, hosts=hosts, progress=progress)
        text += (
            f"; {plural(gone.partitions, 'raw day partition')} expired ({gone.bytes / (1 << 20):,.0f} MiB)"
        )
        if gone.kept_no_rollup:
            text += (
                f", {plural(len(gone.kept_no_rollup), 'old raw day partition')} kept: no rollup covers it yet"
            )
    return text


class RollupKeeper:
    """A background thread that calls ``update`` for one host every ``options.every_s``: the first
    time one period after it starts. Errors are logged (``report``) and retried at the next period;
    they never stop the sampling."""

    def __init__(
        self, root: str | Path, host: str, options: RollupOptions, report: Callable[[str], None] | None = None
    ):
        self.root, self.host, self.options = Path(root), host, options
        self.report = report or log.info
        self.runs = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="gpupool-rollups", daemon=True)

    def start(self) -> RollupKeeper:
        if self.options.every_s > 0:
            self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.options.every_s):
            self.run_once()

    def run_once(self) -> None:
        try:
            self.report(update(self.root, (self.host,), keep_raw_s=self.options.keep_raw_s))
        except Exception as exc:  # a failed build is retried next period; sampling goes on
            title = exc.title if isinstance(exc, GpupoolError) else str(exc)
            self.report(f"rollups not updated: {title} (retried in {self.options.every_s:g} s)")
        self.runs += 1

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            # A build under way is left to the exit: each file it writes is replaced whole.
            self._thread.join(timeout=1.0)
