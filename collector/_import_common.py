"""What both importers share: counting malformed lines and reporting them, writing per host."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from pathlib import Path

from collector._errors import InputError
from collector.words import plural


@dataclass
class ImportReport:
    rows: int = 0
    files: int = 0
    malformed: int = 0
    first_malformed: str | None = None  # "file:line N: why"
    hosts: set[str] = field(default_factory=set)
    ignored_columns: set[str] = field(default_factory=set)
    first_ts: dt.datetime | None = None  # the oldest sample imported (rollups are brought up to date from it)

    def saw(self, rows: list[dict]) -> None:
        if rows:
            first = min(r["ts"] for r in rows)
            self.first_ts = first if self.first_ts is None else min(self.first_ts, first)

    def bad(self, where: str, why: str) -> None:
        self.malformed += 1
        if self.first_malformed is None:
            self.first_malformed = f"{where}: {why}"

    def summary(self) -> str:
        text = f"imported {plural(self.rows, 'row')} from {plural(self.files, 'file')}"
        if self.hosts:
            text += f" (host {', '.join(sorted(self.hosts))})"
        if self.malformed:
            text += f", {plural(self.malformed, 'malformed line')} skipped (first: {self.first_malformed})"
        else:
            text += ", no malformed lines"
        if self.ignored_columns:
            text += f"; columns not in the schema, ignored: {', '.join(sorted(self.ignored_columns))}"
        return text


def read_text(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except FileNotFoundError:
        raise InputError(f"file not found: {path}", "check the path") from None
    except IsADirectoryError:
        raise InputError(f"{path} is a directory", "pass the log files themselves") from None
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror}", "check the file's permissions") from None
