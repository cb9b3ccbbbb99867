"""A real small filesystem (tmpfs) that a test fills to the last byte and frees again.

A full disk is tested on a real one, so every layer answers as it would in production: SQLite's
``database or disk is full`` and its shared-memory index, Parquet writes, ``ENOSPC`` on rename. It
needs root and ``mount`` (CI runs as root); elsewhere the tests skip with the reason.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest


class SmallDisk:
    def __init__(self, path: Path):
        self.path = path
        self.filler = path / ".filler"

    def fill(self) -> None:
        """Take every free byte (one file, appended 4 KiB at a time until ENOSPC)."""
        fd = os.open(self.filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            with contextlib.suppress(OSError):
                while True:
                    os.write(fd, b"\0" * 4096)
            with contextlib.suppress(OSError):  # a last partial block
                while True:
                    os.write(fd, b"\0")
        finally:
            os.close(fd)
        assert shutil.disk_usage(self.path).free < 4096, "the small disk did not fill"

    def free(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.filler.unlink()

    @property
    def free_bytes(self) -> int:
        return shutil.disk_usage(self.path).free


@contextlib.contextmanager
def small_disk(where: Path, size: str = "4m"):
    """A tmpfs of ``size`` mounted at ``where`` for the block, unmounted after (skips where it cannot)."""
    if os.geteuid() != 0 or not shutil.which("mount"):
        pytest.skip("a real full disk needs root to mount a small tmpfs")
    where.mkdir(parents=True, exist_ok=True)
    made = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True
    )
    if made.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.decode().strip()}")
    try:
        yield SmallDisk(where)
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)
