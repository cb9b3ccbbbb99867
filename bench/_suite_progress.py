"""A pytest plugin for bench/framework_suites.py: each test's outcome on disk as it happens, and which tests run.

Loaded with `-p _suite_progress` (bench/ on PYTHONPATH); it does nothing unless SUITE_PROGRESS names a file.
It appends one JSON line per event and flushes each: `{"collected": [ids]}` once the selection is made,
`{"start": id}` before a test, `{"end": id, "outcome": ..., "message": ..., "seconds": ...}` after it (its
setup, call and teardown), `{"finished": status}`
when the session ends. A process that dies in a test (an abort, a segfault) leaves the file ending in that
test's "start": the runner counts it as crashed and runs the rest in a fresh process. pytest's JUnit report,
written only at the end, is lost with such a process.

Outcomes are JUnit's categories: "error" (setup or teardown failed), "failed", "skipped" (xfail included),
"passed". SUITE_SELECT names a file of test ids (one a line) to run, in collection order, the others
deselected; SUITE_SHARD="I/N" keeps every N-th test from the I-th (1-based) of what is left.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

_SINK = None
_REPORTS: dict[str, list] = {}


def _write(record: dict) -> None:
    if _SINK is not None:
        _SINK.write(json.dumps(record) + "\n")
        _SINK.flush()


def pytest_configure(config) -> None:
    global _SINK
    path = os.environ.get("SUITE_PROGRESS")
    if path:
        _SINK = open(path, "a", encoding="utf-8")  # noqa: SIM115 - open for the whole session


@pytest.hookimpl(trylast=True)  # after -k and -m have deselected theirs
def pytest_collection_modifyitems(config, items) -> None:
    keep = list(items)
    select = os.environ.get("SUITE_SELECT")
    if select:
        wanted = set(Path(select).read_text().split("\n"))
        keep = [item for item in keep if item.nodeid in wanted]
    shard = os.environ.get("SUITE_SHARD")
    if shard:
        index, count = (int(n) for n in shard.split("/"))
        keep = [item for k, item in enumerate(keep) if k % count == index - 1]
    if len(keep) != len(items):
        kept = {id(item) for item in keep}
        config.hook.pytest_deselected(items=[item for item in items if id(item) not in kept])
        items[:] = keep
    _write({"collected": [item.nodeid for item in items]})


def pytest_runtest_logstart(nodeid, location) -> None:
    _REPORTS[nodeid] = []
    _write({"start": nodeid})


def pytest_runtest_logreport(report) -> None:
    _REPORTS.setdefault(report.nodeid, []).append(report)


def pytest_runtest_logfinish(nodeid, location) -> None:
    reports = _REPORTS.pop(nodeid, [])
    seconds = sum(getattr(report, "duration", 0.0) for report in reports)
    outcome, message = "passed", ""
    for report in reports:
        if report.failed:
            outcome = "failed" if report.when == "call" else "error"
            crash = getattr(report.longrepr, "reprcrash", None)
            text = crash.message if crash is not None else str(report.longrepr or report.when)
            message = (text.strip().splitlines() or [outcome])[0][:200]
            break
        if report.skipped:
            outcome = "skipped"
    _write({"end": nodeid, "outcome": outcome, "message": message, "seconds": round(seconds, 6)})


def pytest_sessionfinish(session, exitstatus) -> None:
    _write({"finished": int(exitstatus)})
