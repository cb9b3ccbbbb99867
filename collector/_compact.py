"""Merge a day's small segments into one, without ever losing or doubling rows.

The collector writes a segment per table per flush (8 640 a day at the default 10 s). Compaction
rewrites each ``<table>/date=D/host=H/`` folder as one segment. It is safe against a crash at any
point, by a journal written before anything visible changes:

1. write the merged segment under a hidden temporary name and fsync it;
2. write the journal ``.compact-<id>.json`` (the merged name and the originals it replaces) atomically:
   this is the commit point;
3. rename the merged segment into place, remove the originals, remove the journal.

A crash before step 2 leaves only a hidden temporary file (removed by the next run; the originals are
untouched). A crash after it is rolled forward by the next run (``recover``), which completes step 3.
Readers see, for the few milliseconds of step 3, the merged rows and some originals at once; after a
crash, until the next compaction or collector start recovers.

Segments the live collector writes while compaction runs are not in the journal and are left alone.

A damaged segment (its footer does not parse: cut short by a full disk or a partial copy) is moved
aside, out of every reader's way, to ``<root>/damaged/<table>/date=D/host=H/`` under its own name,
and the rest of its folder is compacted as usual.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from collector._errors import CollectorError
from collector.schema import DAMAGED_DIR, METADATA_VERSION_KEY, SCHEMA_VERSION, TABLES
from collector.writer import _fsync_dir, conform

JOURNAL_GLOB = ".compact-*.json"
STALE_TMP_S = 600.0  # an unfinished segment this old belongs to a writer that died


class CompactSkipped(CollectorError):
    """A partition folder compaction leaves alone (and says why)."""


@dataclass
class CompactResult:
    folders: int = 0
    segments_in: int = 0
    segments_out: int = 0
    rows: int = 0
    recovered: int = 0
    skipped: list[str] = field(default_factory=list)
    moved_aside: list[tuple[Path, str]] = field(default_factory=list)  # (where it is now, why)


def _segments(folder: Path) -> list[Path]:
    return sorted(p for p in folder.glob("*.parquet") if not p.name.startswith("."))


def _partition_folders(root: Path, date: dt.date | None) -> list[Path]:
    folders = []
    for table in TABLES:
        pattern = f"date={date.isoformat()}" if date else "date=*"
        folders.extend(p for p in sorted((root / table).glob(f"{pattern}/host=*")) if p.is_dir())
    return folders


def recover(root: Path) -> int:
    """Finish (or clean up after) compactions a crash interrupted, and remove segments a killed writer
    left half-written; returns how many interrupted compactions were found."""
    found = 0
    for table in TABLES:
        for journal in sorted((root / table).glob(f"date=*/host=*/{JOURNAL_GLOB}")):
            found += 1
            _roll_forward(journal)
        for orphan in (root / table).glob("date=*/host=*/.compacted-*.tmp"):
            # a merged segment whose journal was never committed: the originals are intact
            if not any(orphan.parent.glob(JOURNAL_GLOB)):
                orphan.unlink(missing_ok=True)
        for stale in (root / table).glob("date=*/host=*/.*.parquet.tmp"):
            # a segment a killed writer never finished (writing one takes milliseconds): its rows were
            # the unflushed interval, already counted as lost; the file itself is garbage
            with contextlib.suppress(OSError):
                if time.time() - stale.stat().st_mtime > STALE_TMP_S:
                    stale.unlink()
    return found


def _roll_forward(journal: Path) -> None:
    folder = journal.parent
    plan = json.loads(journal.read_text())
    merged = folder / plan["merged"]
    tmp = folder / plan["tmp"]
    if tmp.exists():
        os.replace(tmp, merged)
    if merged.exists():  # only then is it safe to drop what it replaces
        for name in plan["originals"]:
            (folder / name).unlink(missing_ok=True)
    _fsync_dir(folder)
    journal.unlink()
    _fsync_dir(folder)


def move_damaged(folder: Path) -> list[tuple[Path, str]]:
    """Move the segments of ``folder`` whose footer does not parse to ``<root>/damaged/…`` (same
    relative path); returns (new path, why) of each."""
    moved = []
    for path in _segments(folder):
        try:
            pq.read_metadata(path)
            continue
        except (pa.ArrowInvalid, OSError) as exc:
            why = str(exc).split(". ")[0]
        root = folder.parent.parent.parent
        target = root / DAMAGED_DIR / path.relative_to(root)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(path, target)
        _fsync_dir(folder)
        moved.append((target, why))
    return moved


def compact_folder(
    folder: Path, table_name: str, *, hook: Callable[[str], None] | None = None
) -> tuple[int, int]:
    """Merge the segments of one partition folder (damaged ones already moved aside); returns
    (segments merged, rows)."""
    originals = _segments(folder)
    if len(originals) < 2:
        return 0, 0
    step = hook or (lambda _name: None)
    table = TABLES[table_name]
    versions = {(pq.read_schema(p).metadata or {}).get(METADATA_VERSION_KEY) for p in originals}
    if versions != {str(SCHEMA_VERSION).encode()}:
        # Merging would relabel rows of another schema version as this one: leave such folders alone.
        raise CompactSkipped(
            f"{folder}: segments of schema versions {sorted(v.decode() if v else '0' for v in versions)}"
        )
    parts = [pq.read_table(p, partitioning=None) for p in originals]
    merged_data = pa.concat_tables([conform(table, t) for t in parts]).sort_by("ts")
    token = f"{dt.datetime.now(dt.UTC):%Y%m%dT%H%M%S}-{secrets.token_hex(4)}"
    merged = folder / f"{table_name}-compacted-{token}.parquet"
    tmp = folder / f".compacted-{token}.tmp"
    try:
        with open(tmp, "wb") as fh:
            pq.write_table(merged_data, fh, compression="zstd")
            fh.flush()
            os.fsync(fh.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)  # e.g. disk full: the originals are untouched
        raise
    step("merged-written")
    journal = folder / f".compact-{token}.json"
    plan = {"merged": merged.name, "tmp": tmp.name, "originals": [p.name for p in originals]}
    write_journal = folder / f".compact-{token}.json.tmp"
    write_journal.write_text(json.dumps(plan))
    os.replace(write_journal, journal)
    _fsync_dir(folder)
    step("journal-committed")
    os.replace(tmp, merged)
    step("merged-visible")
    for i, p in enumerate(originals):
        p.unlink(missing_ok=True)
        if i == 0:
            step("originals-removing")
    journal.unlink()
    _fsync_dir(folder)
    return len(originals), merged_data.num_rows


def compact(
    root: str | os.PathLike,
    *,
    date: dt.date | None = None,
    before: dt.date | None = None,
    hook: Callable[[str], None] | None = None,
    progress: Callable[[Path, int, int], None] | None = None,
) -> CompactResult:
    """Compact every partition of ``date`` (or of every day before ``before``) under ``root``."""
    root = Path(root)
    result = CompactResult(recovered=recover(root))
    for folder in _partition_folders(root, date):
        result.moved_aside += move_damaged(folder)  # any day's: no reader should meet them
        day = dt.date.fromisoformat(folder.parent.name.removeprefix("date="))
        if date is None and before is not None and day >= before:
            continue
        table_name = folder.parent.parent.name
        try:
            n_in, rows = compact_folder(folder, table_name, hook=hook)
        except CompactSkipped as why:
            result.skipped.append(str(why))
            continue
        if n_in:
            result.folders += 1
            result.segments_in += n_in
            result.segments_out += 1
            result.rows += rows
            if progress:
                progress(folder, n_in, rows)
    return result
