"""Local processes of leases: who they are (pid + start time, so a reused pid is not mistaken for
the original) and whether they still run. psutil is the server's only process library."""

from __future__ import annotations

import contextlib

import psutil


def pid_identity(pids: list[int]) -> list[tuple[int, float]]:
    """(pid, create_time) for each pid that runs on this host now; others are dropped."""
    out = []
    for pid in pids:
        try:
            out.append((pid, psutil.Process(pid).create_time()))
        except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError):
            continue
    return out


def alive_pids(known: list[tuple[int, float | None]]) -> list[tuple[int, float]]:
    out = []
    for pid, created in known:
        try:
            p = psutil.Process(pid)
            if (
                created is None or abs(p.create_time() - created) < 0.01
            ) and p.status() != psutil.STATUS_ZOMBIE:
                out.append((pid, p.create_time()))
        except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError):
            continue
    return out


def with_descendants(known: list[tuple[int, float | None]]) -> set[int]:
    """The live pids and all their children (a training script's data loaders, torchrun's ranks)."""
    out: set[int] = set()
    for pid, _ in alive_pids(known):
        out.add(pid)
        try:
            out.update(c.pid for c in psutil.Process(pid).children(recursive=True))
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return out


def cpu_seconds(pids: set[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            t = psutil.Process(pid).cpu_times()
            total += t.user + t.system
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return total


def terminate(pid: int, created: float | None) -> None:
    """SIGTERM a process we started earlier (an orphaned worker after a restart), if it is still it."""
    for p in alive_pids([(pid, created)]):
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            psutil.Process(p[0]).terminate()
