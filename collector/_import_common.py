"""What both importers share: reading a log file, counting the rows they skip and why, putting each
file's samples in log order, storing them each sample once and all or nothing.

Every data row read ends one of four ways, and the report counts each: stored, malformed (does not
parse), rejected (a value outside its column's physical range, ``collector.schema.row_problem``) or a
duplicate (a row repeated in its file, or a sample of the same GPU at the same time already read or
already stored). A GPU's clock that steps back within a file is found and undone
(``place_in_log_order``), and each step is recorded in the ``clock_steps`` table for the report.
"""

from __future__ import annotations

import codecs
import datetime as dt
import stat
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from collector._errors import InputError
from collector.words import clock_steps, plural


@dataclass
class ClockStep:
    """A GPU's clock stepping back within one log (a row of ``clock_steps``)."""

    host: str
    gpu_index: int | None
    gpu_uuid: str | None
    file: str
    position: str  # "line 31", "scrape 12"
    stamped: dt.datetime  # the time the log gave the first sample after the step
    placed: dt.datetime  # where that sample was put: one interval after the latest before it
    step_s: float
    samples: int = 0  # samples placed later than stamped under this step

    def facts(self) -> tuple:
        """What ``collector.words.clock_steps`` says of it."""
        gpu = self.gpu_index if self.gpu_index is not None else self.gpu_uuid
        return (str(gpu), self.host, self.step_s, self.stamped, self.file, self.position, self.samples)

    def row(self, source: str) -> dict:
        return {
            "ts": self.placed,
            "gpu_index": self.gpu_index,
            "gpu_uuid": self.gpu_uuid,
            "stamped_ts": self.stamped,
            "step_s": self.step_s,
            "samples": self.samples,
            "file": self.file,
            "position": self.position,
            "source": source,
            "simulated": False,
        }


@dataclass
class ImportReport:
    rows: int = 0  # stored
    read: int = 0  # data rows read: stored + malformed rows + rejected + duplicates
    files: int = 0
    malformed: int = 0
    first_malformed: str | None = None  # "file:line N: why"
    rejected: int = 0
    rejected_columns: Counter = field(default_factory=Counter)  # column -> rows rejected for it
    first_rejected: str | None = None
    duplicates: int = 0
    hosts: set[str] = field(default_factory=set)
    ignored_columns: set[str] = field(default_factory=set)
    first_ts: dt.datetime | None = None  # the oldest sample imported (rollups are brought up to date from it)
    # Each step once (a file given twice holds its steps twice): ``found`` adds them.
    clock_steps: list[ClockStep] = field(default_factory=list)
    _step_keys: set[tuple] = field(default_factory=set)

    def saw(self, rows: list[dict]) -> None:
        if rows:
            first = min(r["ts"] for r in rows)
            self.first_ts = first if self.first_ts is None else min(self.first_ts, first)

    def found(self, step: ClockStep) -> None:
        key = (step.host, step.gpu_uuid or step.gpu_index, step.placed, step.stamped)
        if key not in self._step_keys:
            self._step_keys.add(key)
            self.clock_steps.append(step)

    def bad(self, where: str, why: str) -> None:
        self.malformed += 1
        if self.first_malformed is None:
            self.first_malformed = f"{where}: {why}"

    def reject(self, where: str, why: str) -> None:
        """A row that parsed but holds an impossible value (``why`` starts with the column's name)."""
        self.rejected += 1
        self.rejected_columns[why.split(" ", 1)[0]] += 1
        if self.first_rejected is None:
            self.first_rejected = f"{where}: {why}"

    def summary(self) -> str:
        text = f"imported {plural(self.rows, 'row')} from {plural(self.files, 'file')}"
        if self.hosts:
            text += f" (host {', '.join(sorted(self.hosts))})"
        if self.malformed:
            text += f", {plural(self.malformed, 'malformed line')} skipped (first: {self.first_malformed})"
        else:
            text += ", no malformed lines"
        if self.rejected:
            per_column = ", ".join(f"{c} {n}" for c, n in sorted(self.rejected_columns.items()))
            text += (
                f", {plural(self.rejected, 'row')} with impossible values rejected ({per_column}; "
                f"first: {self.first_rejected})"
            )
        if self.duplicates:
            text += (
                f", {plural(self.duplicates, 'duplicate sample')} skipped (already read or already stored)"
            )
        if self.clock_steps:
            text += "; " + clock_steps([step.facts() for step in self.clock_steps])
        if self.ignored_columns:
            text += f"; columns not in the schema, ignored: {', '.join(sorted(self.ignored_columns))}"
        return text


def check_files(paths: list[Path]) -> None:
    """Refuse, before anything is read, a path that is not a regular file: a FIFO or a device would be
    waited on (or read forever), a directory is a mistake."""
    for path in paths:
        try:
            mode = path.stat().st_mode
        except FileNotFoundError:
            raise InputError(f"file not found: {path}", "check the path") from None
        except OSError as exc:
            raise InputError(f"cannot read {path}: {exc.strerror}", "check the path") from None
        if stat.S_ISDIR(mode):
            raise InputError(f"{path} is a directory", "pass the log files themselves")
        if not stat.S_ISREG(mode):
            kind = "a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else "a device"
            raise InputError(
                f"{path} is not a regular file ({kind})", "save the log to a file first and import that"
            )


def read_text(path: Path) -> str:
    """The file's text: UTF-8 with or without a byte-order mark, or UTF-16 with one (what Windows
    PowerShell's ``>`` writes); bytes that do not decode become U+FFFD and fail that line only."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise InputError(f"file not found: {path}", "check the path") from None
    except IsADirectoryError:
        raise InputError(f"{path} is a directory", "pass the log files themselves") from None
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror}", "check the file's permissions") from None
    if data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        return data.decode("utf-16", errors="replace")
    return data.decode("utf-8-sig", errors="replace")


_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_US = dt.timedelta(microseconds=1)


def sample_key(row: dict) -> tuple:
    """What makes a sample one: its time (µs since 1970, as stored) and its GPU (uuid, else index)."""
    return ((row["ts"] - _EPOCH) // _US, gpu_of(row))


def gpu_of(row: dict) -> object:
    """The GPU a sample is of: its uuid, else its index."""
    return row.get("gpu_uuid") or row.get("gpu_index")


def _median(values: list[int]) -> int | None:
    return sorted(values)[(len(values) - 1) // 2] if values else None


def _intervals(rows: list[dict], hosts: list[str], default_s: float) -> tuple[dict[tuple, int], int]:
    """Each GPU's interval (µs) in one file, and the file's: the median time between its rows in log
    order, repeats left out (a step back is one long one; in a log written newest first every one is
    backwards). A GPU with one or two has none (they may be its step back only): the file's stands in,
    else ``default_s``."""
    last: dict[tuple, int] = {}
    spacing: dict[tuple, list[int]] = {}
    for row, host in zip(rows, hosts, strict=True):
        gpu, t = (host, gpu_of(row)), (row["ts"] - _EPOCH) // _US
        if gpu in last and t != last[gpu]:
            spacing.setdefault(gpu, []).append(abs(t - last[gpu]))
        last[gpu] = t
    every = _median([d for ds in spacing.values() for d in ds]) or round(default_s * 1e6)
    return {gpu: _median(ds) for gpu, ds in spacing.items() if len(ds) >= 3}, every


def _by_stamp(rows: list[dict], hosts: list[str]) -> dict[tuple, tuple[dict, ...]]:
    """(GPU, stamped µs) -> the rows with that stamp."""
    found: dict[tuple, tuple[dict, ...]] = {}
    for row, host in zip(rows, hosts, strict=True):
        key = ((host, gpu_of(row)), (row["ts"] - _EPOCH) // _US)
        found[key] = (*found.get(key, ()), row)
    return found


def _same_values(a: dict, b: dict) -> bool:
    # Two rows of one file read with the same time: equal in every other value both have (a placed
    # row's time may have moved since; a log whose header changed part-way, two logs of other
    # columns joined, repeat their samples in other columns).
    return all(a[k] == b[k] for k in a.keys() & b.keys() if k != "ts")


def place_in_log_order(
    rows: list[dict],
    positions: list[str],
    hosts: list[str],
    file: str,
    report: ImportReport,
    interval_s: float,
) -> list[tuple[str, dict]]:
    """(host, row) of ``rows`` of one file, in log order (``positions[i]`` says where row i is,
    ``hosts[i]`` whose it is), less the rows the file repeats and with each GPU's clock steps back undone.

    Per GPU, in log order: a sample stamped no later than the latest one placed that is equal in every
    value (its time included) to one read before in the file is a repeated line, a duplicate. A
    distinct sample stamped earlier than the latest one placed is after a step back of the clock: it
    is placed one interval (``_intervals``) after the latest, and the GPU's later samples are shifted
    by as much, until the clock catches up (a sample stamped later than every one placed, after a gap
    longer than the step). So each distinct sample stands for its own interval, none is lost as a
    "duplicate" of one it happens to share a time with, and the step is recorded in
    ``report.clock_steps``. A distinct sample stamped at the same time as the latest one stays that:
    the same instant, one sample (``store`` keeps the first)."""
    # (GPU, stamped µs) -> the rows read with that stamp: made at the first row not after the latest
    # (none of the rows before it was dropped or moved), so a log in order never pays for it
    read: dict[tuple, tuple[dict, ...]] | None = None
    latest: dict[tuple, int] = {}  # the latest time placed per GPU
    shift: dict[tuple, tuple[int, ClockStep]] = {}  # GPU -> (µs added to its stamps, the step that did)
    intervals = None  # (per GPU, the file's): worked out at the first step back
    kept = []
    for i, (row, host, position) in enumerate(zip(rows, hosts, positions, strict=True)):
        gpu, t = (host, gpu_of(row)), (row["ts"] - _EPOCH) // _US
        before = latest.get(gpu)
        add, step = shift.get(gpu, (0, None))
        if add and t > before:  # the clock caught up: its own time is after every sample placed
            add, step = 0, None
            del shift[gpu]
        if before is not None and t + add <= before:
            if read is None:
                read = _by_stamp(rows[:i], hosts[:i])
            if any(_same_values(other, row) for other in read.get((gpu, t), ())):
                report.duplicates += 1
                continue
            if t + add < before:
                if intervals is None:
                    intervals = _intervals(rows, hosts, interval_s)
                back = before + intervals[0].get(gpu, intervals[1]) - (t + add)
                add += back
                step = ClockStep(
                    host,
                    row.get("gpu_index"),
                    row.get("gpu_uuid"),
                    file,
                    position,
                    row["ts"],
                    _EPOCH + (t + add) * _US,
                    back / 1e6,
                )
                report.found(step)
                shift[gpu] = (add, step)
        if read is not None:
            read[gpu, t] = (*read.get((gpu, t), ()), row)
        if add:
            row["ts"] = _EPOCH + (t + add) * _US
            step.samples += 1
        latest[gpu] = t + add if before is None else max(t + add, before)
        kept.append((host, row))
    return kept


def _stored_keys(out: str | Path, host: str, days: set[dt.date], table: str = "gpu_samples") -> set[tuple]:
    """Keys (``sample_key``) of the rows of ``table`` already stored for ``host`` on ``days`` (a
    directory or a bucket)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyarrow.fs import FileSelector, FileType

    from collector.location import filesystem, parse_location

    fs, base = filesystem(parse_location(out))
    keys: set[tuple] = set()
    for day in sorted(days):
        folder = f"{base}/{table}/date={day.isoformat()}/host={host}"
        try:
            listing = fs.get_file_info(FileSelector(folder, allow_not_found=True))
        except NotADirectoryError:  # nothing stored there (and the write will say why it cannot be)
            continue
        for info in listing:
            if info.type != FileType.File or info.base_name.startswith("."):
                continue
            if not info.base_name.endswith(".parquet"):
                continue
            try:
                got = pq.read_table(info.path, columns=["ts", "gpu_uuid", "gpu_index"], filesystem=fs)
            except (pa.ArrowInvalid, OSError):  # a damaged segment: the readers skip it too
                continue
            us = got.column("ts").cast(pa.int64()).to_pylist()  # integers: 20x faster than datetimes
            for t, uuid, index in zip(
                us, got.column("gpu_uuid").to_pylist(), got.column("gpu_index").to_pylist(), strict=True
            ):
                keys.add((t, uuid or index))
    return keys


def _new_samples(out: str | Path, host: str, rows: list[dict], report: ImportReport) -> list[dict]:
    """``rows`` less those already read (a file with duplicate rows, the same file given twice) or
    already stored (an import run again), counted in ``report.duplicates``."""
    seen = _stored_keys(out, host, {r["ts"].date() for r in rows})
    fresh = []
    for row in rows:
        key = sample_key(row)
        if key in seen:
            report.duplicates += 1
            continue
        seen.add(key)
        fresh.append(row)
    return fresh


def _new_steps(out: str | Path, host: str, report: ImportReport, source: str) -> list[dict]:
    """The ``clock_steps`` rows of ``host`` not stored yet (an import run again finds the same steps)."""
    rows = [step.row(source) for step in report.clock_steps if step.host == host]
    if not rows:
        return []
    stored = _stored_keys(out, host, {r["ts"].date() for r in rows}, "clock_steps")
    return [r for r in rows if sample_key(r) not in stored]


def store(out: str | Path, rows_by_host: dict[str, list[dict]], report: ImportReport, source: str) -> None:
    """Write each host's new samples, and the clock steps found in them, into ``out``: all of them or,
    if anything fails part-way (a full disk, a refused upload), none (the segments already written
    are removed)."""
    from collector.writer import TelemetryWriter, check_host

    fresh = {check_host(h): _new_samples(out, h, rows, report) for h, rows in rows_by_host.items()}
    steps = {host: _new_steps(out, host, report, source) for host in fresh}
    writers = []
    try:
        for host, rows in fresh.items():
            if rows or steps[host]:
                writer = TelemetryWriter(out, host, flush_interval_s=0, undoable=True)
                writers.append(writer)
                writer.append("gpu_samples", rows)  # typed here: a bad value fails before any write
                writer.append("clock_steps", steps[host])
        for writer in writers:
            writer.close()
    except BaseException:
        for writer in writers:
            writer.undo()
        raise
    for host, rows in fresh.items():
        report.hosts.add(host)
        report.rows += len(rows)
        report.saw(rows)
