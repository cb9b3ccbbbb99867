"""One error tree and one duration syntax for every command (collector.errors, collector.durations)."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from collector.durations import format_duration, parse_duration
from collector.errors import GpupoolError

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("collector", "analytics", "reports", "tui", "server", "virtualize")
# Exceptions that never reach a person: control flow inside one module, or a CUDA result travelling back
# to the program that made the call (virtualize/common/_results.py turns it into a CUresult).
NOT_FOR_PEOPLE = {
    "collector.durations.OutOfRange": "parse_duration's ValueError: argument() and setting() word it",
    "server._pool._Conflict": "a cluster grant's compare-and-swap lost; retried at once",
    "virtualize.server._executor.CudaError": "a CUDA result code, answered to the caller as CUresult",
    "virtualize.server.worker.ConnectionClosed": "the shim hung up; the worker's loop ends",
    "virtualize.server._address_window.WindowFull": "the address window's allocator, answered as out-of-memory",
    "virtualize.server._guard_nccl.Refused": "an NCCL call the worker refuses, answered as its ncclResult_t",
    "virtualize.server._nccl.NcclUnavailable": "no NCCL on the server: logged once, answered as ncclSystemError",
}


def _exception_classes() -> dict[str, type]:
    """Every exception class defined in the project's packages, by dotted name (read from the source,
    then imported to see its real bases)."""
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
            tree = ast.parse(path.read_text())
            names = [n.name for n in tree.body if isinstance(n, ast.ClassDef) and n.bases]
            if not names:
                continue
            try:
                mod = importlib.import_module(module)
            except ImportError:  # an optional extra (the report's streamlit, the console's textual)
                continue
            for name in names:
                cls = getattr(mod, name, None)
                if isinstance(cls, type) and issubclass(cls, BaseException):
                    found[f"{module}.{name}"] = cls
    return found


def test_every_error_a_person_can_see_has_a_title_a_hint_and_an_exit_code():
    """Each exception class of the project derives from collector.errors.GpupoolError (title, hint,
    exit_code), unless it never reaches a person (listed with the reason): a command catching its
    package's root prints every error the same way, and nothing asks an exception for a title it may
    not have."""
    classes = _exception_classes()
    assert "server.client_errors.PoolClientError" in classes  # the scan sees the packages
    strays = [
        name
        for name, cls in classes.items()
        if not issubclass(cls, GpupoolError) and name not in NOT_FOR_PEOPLE
    ]
    assert not strays, f"derive these from their package's error root: {strays}"
    gone = [name for name in NOT_FOR_PEOPLE if name not in classes]
    assert not gone, f"no longer defined, drop from NOT_FOR_PEOPLE: {gone}"


def test_no_two_error_classes_share_a_name():
    """Two exceptions named alike (once: a server-side and a client-side LeaseEnded) make an ``except``
    catch the wrong one depending on an import; every name is used once."""
    by_name: dict[str, list[str]] = {}
    for dotted in _exception_classes():
        by_name.setdefault(dotted.rsplit(".", 1)[1], []).append(dotted)
    assert {n: d for n, d in by_name.items() if len(d) > 1} == {}


@pytest.mark.parametrize(
    "argv",
    [
        ["collector.cli", "--interval", "often"],
        ["reports.cli", "--no-such-option"],
        ["tui.cli", "--refresh", "soon"],
        ["server.cli", "serve", "--lease-ttl", "soon", "--simulate-gpus", "1xH100-80GB"],
        ["virtualize.client.cli", "--no-such-option"],
    ],
    ids=["gpustat-collect", "gpustat-report", "gpupool-console", "gpupool-server", "gpuattach"],
)
def test_every_command_reports_an_error_as_one_line_with_a_hint_and_a_nonzero_exit(argv, tmp_path):
    """Bad input to any gpupool command: one line on stderr, ``PROG: error: what (hint: what to do)``,
    no traceback, a non-zero exit."""
    proc = subprocess.run(
        [sys.executable, "-m", *argv], capture_output=True, text=True, timeout=60, cwd=tmp_path,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
    )  # fmt: skip
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode != 0 and len(lines) == 1, proc.stderr
    prog, _, rest = lines[0].partition(": error: ")
    assert prog and rest and "(hint: " in rest and rest.endswith(")"), lines[0]


@pytest.mark.parametrize("seconds", [0.5, 1, 45, 90, 600, 725, 3600, 5400, 86400, 90000, 604800, 3153600000])
def test_a_duration_shown_exactly_reads_back_as_the_same_duration(seconds):
    """The ``exact`` style (config files, the ranges in docs and messages) is read back by the one parser
    to the same number of seconds, so a value copied from a message into a config file means it."""
    assert parse_duration(format_duration(seconds, "exact")) == seconds
