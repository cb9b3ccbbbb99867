"""The one sampling loop: tick the source, hand rows to the writer, keep the live state and status.

``gpustat-collect`` runs it, and so does the pool server (``server._serve``: no writer without
``--telemetry``, its live numbers through ``on_tick``, a failed tick logged through ``on_error``).
"""

from __future__ import annotations

import datetime as dt
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TextIO

from collector._prometheus import LiveState
from collector._source import Source, Tick
from collector.words import plural
from collector.writer import TelemetryWriter


@dataclass
class RunOptions:
    interval_s: float = 1.0
    duration_s: float | None = None  # None: until stopped


@dataclass
class RunStats:
    ticks: int = 0
    gpu_rows: int = 0
    process_rows: int = 0


def _ago(t: float | None) -> str:
    return "never" if t is None else f"{max(0.0, time.time() - t):.0f} s ago"


class Status:
    """One self-rewriting line on a terminal; otherwise a plain log line per flush, at most one a minute
    (or nothing with -q)."""

    def __init__(self, stream: TextIO | None = None, *, quiet: bool = False, label: str = ""):
        self.stream = stream if stream is not None else sys.stderr
        self.quiet = quiet
        self.tty = self.stream.isatty()
        self.label = label
        self._last_logged_flush: float | None = None
        self._logged_at = -float("inf")
        self.log_every_s = 60.0

    def line(self, gpus: int, writer: TelemetryWriter, ticks: int) -> str:
        return (
            f"gpustat-collect{self.label}: {plural(gpus, 'GPU')} · {plural(ticks, 'tick')} · {plural(writer.rows_written, 'sample')} written "
            f"· {writer.buffered_rows} buffered · last flush {_ago(writer.last_flush)}"
        )

    def update(self, gpus: int, writer: TelemetryWriter, ticks: int) -> None:
        if self.quiet:
            return
        if self.tty:
            self.stream.write("\r\x1b[K" + self.line(gpus, writer, ticks))
            self.stream.flush()
        elif (
            writer.last_flush != self._last_logged_flush
            and time.monotonic() - self._logged_at >= self.log_every_s
        ):
            # a log line per flush, at most one a minute: readable in journald over months
            self._last_logged_flush = writer.last_flush
            self._logged_at = time.monotonic()
            stamp = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            print(f"{stamp} {self.line(gpus, writer, ticks)}", file=self.stream, flush=True)

    def event(self, message: str) -> None:
        """A line that matters (a GPU lost or back), shown even with -q."""
        if self.tty and not self.quiet:
            self.stream.write("\r\x1b[K")
        stamp = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        print(f"{stamp} gpustat-collect: {message}", file=self.stream, flush=True)

    def finish(self) -> None:
        if self.tty and not self.quiet:
            self.stream.write("\n")
            self.stream.flush()


def run(
    source: Source,
    writer: TelemetryWriter | None,
    options: RunOptions,
    *,
    stop: threading.Event,
    state: LiveState | None = None,
    status: Status | None = None,
    on_tick: Callable[[Tick], None] | None = None,
    on_error: Callable[[Exception], None] | None = None,
) -> RunStats:
    """Tick until ``duration_s`` passes, ``stop`` is set or a finite source runs out.

    ``writer`` None: samples only for ``state`` and ``on_tick`` (each tick's rows, as written).
    Raises the writer's error (TelemetryWriteError) as soon as a background flush fails, so the CLI can
    report it; buffered rows stay in the writer. A failure expected to pass (``error.passes``: a full
    disk, an object store's outage) is not given up on: it is told once as an event, sampling goes on,
    and the rows wait in memory for a flush that succeeds. With ``on_error`` (a long-running service
    whose other work must go on) nothing is raised: a tick that fails is handed to it and the next
    tick comes on time.
    """
    stats = RunStats()
    gpus = len(source.inventory())
    states: dict[int, str] = {}
    failing: str | None = None  # the write error last told, while an object store is failing
    told: str | None = None  # the failed tick last handed to on_error
    started = time.monotonic()
    next_tick = started

    def one_tick() -> None:
        nonlocal failing
        tick = source.sample(dt.datetime.now(dt.UTC))
        _append(writer, tick, stats)
        stats.ticks += 1
        if on_tick is not None:
            on_tick(tick)
        if state is not None:
            state.update(tick.gpu_rows, tick.process_rows)
            if writer is not None:
                state.samples_written = writer.rows_written
                state.last_flush = writer.last_flush
        if writer is None:
            return
        if writer.error is not None and not writer.error.passes:
            raise writer.error
        failing = _report_write_state(writer, failing, status)
        if status is not None:
            _report_state_changes(tick.gpu_rows, states, status)
            status.update(gpus, writer, stats.ticks)

    while not stop.is_set():
        try:
            one_tick()
            told = None
        except Exception as exc:
            if on_error is None:
                raise
            if repr(exc) != told:  # the same failure at every tick is told once
                on_error(exc)
            told = repr(exc)
        if source.exhausted:
            break
        elapsed = time.monotonic() - started
        if options.duration_s is not None and elapsed >= options.duration_s:
            break
        next_tick += options.interval_s
        if next_tick < time.monotonic():  # we fell behind (suspend, slow disk): skip, do not burst
            next_tick = time.monotonic() + options.interval_s
        wait = next_tick - time.monotonic()
        if options.duration_s is not None:
            wait = min(wait, max(0.0, started + options.duration_s - time.monotonic()))
        if wait > 0:
            stop.wait(wait)
    last = source.drain()
    _append(writer, last, stats)
    return stats


def _append(writer: TelemetryWriter | None, tick: Tick, stats: RunStats) -> None:
    if writer is not None:
        writer.append("gpu_samples", tick.gpu_rows)
        writer.append("process_samples", tick.process_rows)
    stats.gpu_rows += len(tick.gpu_rows)
    stats.process_rows += len(tick.process_rows)


def _report_write_state(writer: TelemetryWriter, failing: str | None, status: Status | None) -> str | None:
    error = writer.error
    if error is not None and error.title != failing:
        if status is not None:
            status.event(
                f"{error.title}; {writer.buffered_rows} rows kept in memory and retried at every flush, "
                "sampling goes on"
            )
        return error.title
    if error is None and failing is not None:
        if status is not None:
            status.event(f"telemetry written again to {writer.location}")
        return None
    return failing


def _report_state_changes(rows: list[dict], states: dict[int, str], status: Status) -> None:
    for row in rows:
        index, state = row["gpu_index"], row.get("state") or "ok"
        before = states.get(index, "ok")
        states[index] = state
        if state == before:
            continue
        who = f"GPU {index} ({row.get('gpu_uuid') or 'no uuid'})"
        if state == "lost":
            status.event(
                f"{who} stopped answering (fell off the bus?): recorded as state=lost; sampling the other GPUs"
            )
        else:
            status.event(f"{who} answers again (state={state})")
