"""The one base of every error gpupool reports to a person, and the one way a command prints it.

Each package has one root deriving from ``GpupoolError``; every error it raises for a user derives from
that root, so a command catches its package's root and nothing else, and no code asks an exception
whether it happens to have a title:

    GpupoolError                 title (one line: what happened), hint (what to do), exit_code
    ├── collector.CollectorError         collector/_errors.py (NvmlUnavailable, TelemetryWriteError, ...)
    │   └── TelemetryError               collector/reader.py (a telemetry folder that cannot be read;
    │                                    analytics and reports raise it too)
    ├── server.errors.ServerError        server/errors.py
    │   ├── PoolError                    the server's refusals, one per HTTP status (server/_errors.py)
    │   ├── PoolClientError              the client library's (server/client_errors.py)
    │   └── EtcdUnavailable, EtcdError, WorkerError, Denied (the Kubernetes webhook's)
    ├── virtualize.common.errors.VirtualizeError    virtualize/common/errors.py (ShimNotBuilt, CensusError, TlsUnavailable,
    │                                             JobError: the Slurm hook's, UncheckedArgument,
    │                                             MigrationRefused)
    └── tui.cli.UsageError               the console's bad options (exit 2)

``reports`` raises none of its own: it reports analytics' and the OS's errors. Collector is the lowest
package (every other one imports it), so the base lives here.
"""

from __future__ import annotations

import sys


class GpupoolError(Exception):
    """An error a person can act on: ``title`` says what happened, ``hint`` what to do; a command that
    stops on it exits with ``exit_code``."""

    exit_code = 1

    def __init__(self, title: str, hint: str = "", *, exit_code: int | None = None):
        super().__init__(title)
        self.title, self.hint = title, hint
        if exit_code is not None:
            self.exit_code = exit_code

    def __str__(self) -> str:
        return f"{self.title} (hint: {self.hint})" if self.hint else self.title


def report(prog: str, title: str, hint: str = "", code: int = 1) -> int:
    """Print ``PROG: error: TITLE (hint: HINT)`` on stderr, one line; return ``code`` (the exit status)."""
    print(f"{prog}: error: {title}" + (f" (hint: {hint})" if hint else ""), file=sys.stderr, flush=True)
    return code


def report_error(prog: str, exc: GpupoolError, code: int | None = None) -> int:
    """``report`` for an error: its title and hint; its own exit code unless the command sets one."""
    return report(prog, exc.title, exc.hint, exc.exit_code if code is None else code)
