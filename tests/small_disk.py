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
import threading
from pathlib import Path

import pytest
import required_tools


class SmallDisk:
    def __init__(self, path: Path):
        self.path = path
        self.filler = path / ".filler"
        self._stop = threading.Event()
        self._keeper: threading.Thread | None = None

    def fill(self, *, keep: bool = False) -> None:
        """Take every free byte. ``keep``: go on taking whatever a writer frees again (a failed
        write that deletes its temporary file) until ``free()``, so the disk stays full."""
        self._top_up()
        assert shutil.disk_usage(self.path).free < 4096, "the small disk did not fill"
        if keep:
            self._stop.clear()
            self._keeper = threading.Thread(target=self._keep_full, daemon=True)
            self._keeper.start()

    def _top_up(self) -> None:
        fd = os.open(self.filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            for size in (4096, 1):  # whole blocks, then the last partial one
                with contextlib.suppress(OSError):
                    while True:
                        os.write(fd, b"\0" * size)
        finally:
            os.close(fd)

    def _keep_full(self) -> None:
        while not self._stop.wait(0.01):
            self._top_up()

    def free(self) -> None:
        self._stop.set()
        if self._keeper is not None:
            self._keeper.join(timeout=10)
            self._keeper = None
        with contextlib.suppress(FileNotFoundError):
            self.filler.unlink()


@contextlib.contextmanager
def small_disk(where: Path, size: str = "4m"):
    """A tmpfs of ``size`` mounted at ``where`` for the block, unmounted after (where it cannot: fails,
    or skips with GPUPOOL_ALLOW_MISSING_TOOLS=1, as tests/required_tools.py says)."""
    required_tools.require("tmpfs")
    where.mkdir(parents=True, exist_ok=True)
    made = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True
    )
    if made.returncode:
        pytest.fail(f"cannot mount a tmpfs at {where}: {made.stderr.decode().strip()}", pytrace=False)
    disk = SmallDisk(where)
    try:
        yield disk
    finally:
        disk.free()
        subprocess.run(["umount", "-l", str(where)], capture_output=True)
