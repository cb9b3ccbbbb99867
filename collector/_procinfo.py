"""Who owns a GPU process: user and container id, read from /proc (NVML reports host PIDs only)."""

from __future__ import annotations

import pwd
import re
from pathlib import Path

# Container runtimes put a 64-hex id in the cgroup path: docker-<id>.scope, /docker/<id>,
# cri-containerd-<id>.scope, crio-<id>.scope, libpod-<id>.scope, /kubepods/.../<id>.
_CONTAINER_ID = re.compile(r"(?:^|[/-])([0-9a-f]{64})(?:\.scope)?(?:/|$)")


def container_id_from_cgroup(text: str) -> str | None:
    """The container id in a /proc/PID/cgroup text, or None for a process outside containers."""
    for line in text.splitlines():
        path = line.split(":", 2)[-1]
        match = _CONTAINER_ID.search(path)
        if match:
            return match.group(1)
    return None


def uid_from_status(text: str) -> int | None:
    for line in text.splitlines():
        if line.startswith("Uid:"):
            fields = line.split()
            return int(fields[1]) if len(fields) > 1 else None
    return None


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)  # a uid without a passwd entry (common inside containers)


class ProcessInfo:
    """Cache of (name, user, container id) per PID, dropped once the PID leaves the GPU."""

    def __init__(self, proc: Path = Path("/proc")):
        self._proc = proc
        self._cache: dict[int, tuple[str | None, str | None, str | None]] = {}

    def describe(self, pid: int) -> tuple[str | None, str | None, str | None]:
        """(process name, user, container id); None for what /proc does not show (another PID namespace)."""
        hit = self._cache.get(pid)
        if hit is not None:
            return hit
        base = self._proc / str(pid)
        name = _read(base / "comm")
        status = _read(base / "status")
        uid = uid_from_status(status) if status else None
        cgroup = _read(base / "cgroup")
        info = (
            command_name(_read(base / "cmdline"), name),
            _user_name(uid) if uid is not None else None,
            container_id_from_cgroup(cgroup) if cgroup else None,
        )
        if name is not None:  # only cache what we could see; a vanished PID is retried
            self._cache[pid] = info
        return info

    def forget_except(self, live_pids: set[int]) -> None:
        for pid in list(self._cache):
            if pid not in live_pids:
                del self._cache[pid]


NAME_MAX = 60


def command_name(cmdline: str | None, comm: str | None) -> str | None:
    """The name a person recognises: the program and what it runs ("python3 train.py", "python3 -m
    vllm.entrypoints"), from /proc/PID/cmdline; /proc/PID/comm (cut at 15 characters) when that is empty."""
    args = [a for a in (cmdline or "").split("\0") if a]
    if not args:
        return comm.strip() or None if comm else None
    words = [args[0].rsplit("/", 1)[-1]]
    rest = iter(args[1:])
    for a in rest:
        if a == "-m":  # python -m module: the module is the name
            words += ["-m", next(rest, "")]
            break
        if not a.startswith("-"):
            words.append(a.rsplit("/", 1)[-1])
            break
    name = " ".join(w for w in words if w)
    return name if len(name) <= NAME_MAX else name[: NAME_MAX - 1] + "…"


def _read(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return None
