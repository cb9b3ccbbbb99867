"""One ``gpupool-server`` per state directory: an exclusive ``flock`` on the directory itself.

Two servers on one state directory would grant the same GPUs twice from two views of one store, and
each would stop the other's workers as orphans. The lock belongs to the open directory, so the kernel
drops it when the process ends, however it ends (``kill -9`` included): a lock left by a crash never
blocks a restart. Locking the directory, not a file in it, needs no new space (a server must restart
on a full disk). The holder's PID goes to ``server.pid`` beside it, for the refusal message; that file
is rewritten in place and never removed, so a full disk rarely keeps it from being written.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from pathlib import Path

from server._errors import PoolError

PID_FILE = "server.pid"


class StateDirLock:
    """Held from ``acquire()`` until ``release()`` or the end of the process."""

    def __init__(self, state_dir: Path):
        self.state_dir = state_dir
        self.fd: int | None = None

    def acquire(self) -> StateDirLock:
        try:
            self.state_dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.state_dir, os.O_RDONLY | os.O_DIRECTORY)  # not inherited by workers
        except OSError as exc:
            raise PoolError(
                f"cannot use the state directory {self.state_dir}: {exc.strerror}",
                "pass --state-dir to a directory this user can create and write",
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise PoolError(f"cannot lock the state directory {self.state_dir}: {exc.strerror}") from None
            holder = self.holder()
            who = f"PID {holder}" if holder else "its PID is not recorded"
            raise PoolError(
                f"another gpupool-server ({who}) already serves the state directory {self.state_dir}",
                "stop that one first, or give this one its own --state-dir",
                pid=holder,
            ) from None
        self.fd = fd
        self._record_pid()
        return self

    def _record_pid(self) -> None:
        text = f"{os.getpid()}\n".encode()
        with contextlib.suppress(OSError):  # best effort: the lock holds whether or not this lands
            pid_fd = os.open(self.state_dir / PID_FILE, os.O_WRONLY | os.O_CREAT, 0o644)
            try:
                os.pwrite(pid_fd, text, 0)  # in place: an existing block is reused on a full disk
                os.ftruncate(pid_fd, len(text))
            finally:
                os.close(pid_fd)

    def holder(self) -> int | None:
        """The PID the holder recorded (None if unreadable)."""
        try:
            return int((self.state_dir / PID_FILE).read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing the directory drops the lock
            self.fd = None
