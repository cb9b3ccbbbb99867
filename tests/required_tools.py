"""The system tools the test suite drives for real: one table, tool -> Debian package -> what needs it.

A test that needs one says so with a marker, ``@pytest.mark.needs("etcd")`` (or ``pytestmark`` for a
whole file; ``require("tmpfs")`` inside a helper); ``tests/conftest.py`` checks the tool before the test and **fails** it when the tool is
missing: CI that skips a subsystem it could have tested is green for the wrong reason. On a
developer's own machine ``GPUPOOL_ALLOW_MISSING_TOOLS=1`` turns those failures back into skips.
``scripts/test.sh`` installs the missing packages from this table (``python3 tests/required_tools.py``
prints them) and stops when it cannot. Stdlib only: it runs before the virtualenv exists.

To add a tool: one row here (its commands or its check), then the marker on the tests that drive it.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass

ALLOW_ENV = "GPUPOOL_ALLOW_MISSING_TOOLS"


def _native_built() -> str | None:
    missing = [
        m
        for m in ("virtualize.client._libcuda_shim", "virtualize.server._dispatch")
        if importlib.util.find_spec(m) is None
    ]
    if missing:
        return f"{', '.join(missing)} not built (with gcc installed: pip install -e . or setup.py build_ext --inplace)"
    return None


def _network_link() -> str | None:
    import netem_link  # tests/ is on the path under pytest; imported only when a netem test runs

    why = netem_link.unavailable()
    return None if why is None else f"no shaped network link here: {why}"


def _tmpfs() -> str | None:
    if os.geteuid() != 0:
        return "mounting a small tmpfs (a real full disk) needs root"
    if shutil.which("mount") is None:
        return "`mount` is not installed"
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as where:
        made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", where], capture_output=True)
        subprocess.run(["umount", "-l", where], capture_output=True)
    return None if made.returncode == 0 else f"cannot mount a tmpfs here: {made.stderr.decode().strip()}"


@dataclass(frozen=True)
class Tool:
    package: str  # the Debian package that provides it (scripts/test.sh installs it)
    needed_by: str  # what the tests that need it drive
    commands: tuple[str, ...] = ()  # present when any of these is on PATH
    files: tuple[str, ...] = ()  # or when any of these files exists (a header, a daemon outside PATH)
    check: Callable[[], str | None] | None = None  # otherwise: None when present, else why not


TOOLS: dict[str, Tool] = {
    "cc": Tool("gcc", "the remote-execution shim and the worker's native loop, built and run", ("cc",)),
    "native": Tool(
        "gcc", "the built shim and native loop (TLS, native dispatch, pool remote runs)", check=_native_built
    ),
    "chromium": Tool("chromium", "the report in a real headless browser", ("chromium", "chromium-browser")),
    "tmux": Tool("tmux", "the console in a real terminal", ("tmux",)),
    "git": Tool(
        "git", "bench/fetch_suites.sh: a partial clone of a framework's tests and what they import", ("git",)
    ),
    "etcd": Tool("etcd-server", "cluster mode and the etcd client against a real etcd", ("etcd",)),
    "openssl": Tool("openssl", "the console over TLS with a private CA", ("openssl",)),
    "iproute2": Tool(
        "iproute2", "a shaped link built with ip and tc (the netlink way needs neither)", ("tc",)
    ),
    "tmpfs": Tool("mount", "a really full disk: the writer's and the pool's full-disk tests", check=_tmpfs),
    "slurm": Tool(
        "slurm-wlm",
        "a real slurmctld and slurmd running sbatch/srun jobs (tests/slurm_cluster.py)",
        files=("/usr/sbin/slurmctld",),
    ),
    "munge": Tool(
        "munge",
        "Slurm's authentication daemon, started by tests/slurm_cluster.py",
        files=("/usr/sbin/munged",),
    ),
    "spank": Tool(
        "libslurm-dev",
        "the SPANK plugin (deploy/slurm) compiled against slurm/spank.h",
        files=("/usr/include/slurm/spank.h",),
    ),
    "netem": Tool(
        "iproute2", "remote runs over a shaped link (root: a network namespace)", check=_network_link
    ),
}


@functools.cache
def missing(name: str) -> str | None:
    """None when tool ``name`` of the table is here, else one line saying what is missing and how to get it."""
    tool = TOOLS[name]  # a KeyError names a marker with no row: add the row
    if tool.commands or tool.files:
        if _present(tool):
            return None
        what = tool.commands[0] if tool.commands else tool.files[0]
        return f"`{what}` is not installed (Debian package {tool.package}), needed for {tool.needed_by}"
    why = tool.check() if tool.check else None
    return None if why is None else f"{why} (Debian package {tool.package}), needed for {tool.needed_by}"


def require(name: str) -> None:
    """In a test: return where tool ``name`` is here; else fail the test, or skip it where the
    developer opted out (``GPUPOOL_ALLOW_MISSING_TOOLS=1``). The ``needs`` marker calls this."""
    import pytest

    why = missing(name)
    if why is None:
        return
    if allowed():
        pytest.skip(why)
    pytest.fail(
        f"{why}: install it (scripts/test.sh does, as root), or set {ALLOW_ENV}=1 on a developer's "
        "machine to skip such tests",
        pytrace=False,
    )


def allowed() -> bool:
    """Whether missing tools may skip their tests (a developer's machine) rather than fail them."""
    return os.environ.get(ALLOW_ENV, "") not in ("", "0")


def _present(tool: Tool) -> bool:
    return any(shutil.which(c) for c in tool.commands) or any(os.path.exists(f) for f in tool.files)


def missing_packages() -> list[str]:
    """The Debian packages of the table's commands and files that are not here, each once."""
    return sorted({t.package for t in TOOLS.values() if (t.commands or t.files) and not _present(t)})


if __name__ == "__main__":
    if sys.argv[1:] not in ([], ["--missing-packages"]):
        sys.exit(
            "usage: python3 tests/required_tools.py [--missing-packages]: the Debian packages to install"
        )
    for package in missing_packages():
        print(package)
