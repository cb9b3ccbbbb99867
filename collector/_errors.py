"""The collector's errors, each a one-line title plus a hint for the user.

CollectorError                 anything the CLI reports as one line and a non-zero exit
├── NvmlUnavailable            NVML did not start (no driver, no library, no GPU)
├── TelemetryWriteError        the telemetry directory or bucket cannot be written (permissions, disk
│                              full; a missing bucket, refused credentials, a store that does not answer)
├── InputError                 a file or option given by the user cannot be used
└── TelemetryError             a telemetry directory cannot be read as asked (collector/reader.py)

└── GpuLost                    one GPU stopped answering; recorded as state='lost', not fatal

Its root derives from ``collector.errors.GpupoolError``, the base of every package's errors.
"""

from __future__ import annotations

from collector.errors import GpupoolError


class CollectorError(GpupoolError):
    """An error the user can act on: ``title`` says what happened, ``hint`` what to do."""

    exit_code = 2


class NvmlUnavailable(CollectorError):
    """NVML does not start on this machine (no NVIDIA driver, no libnvidia-ml, no GPU)."""

    def __init__(self, reason: str):
        super().__init__(
            f"no NVIDIA driver/NVML found ({reason})", "use --simulate N to try gpupool without GPUs"
        )
        self.reason = reason


class TelemetryWriteError(CollectorError):
    """A telemetry segment could not be written; the rows stay buffered for the next attempt.

    ``passes``: the cause is expected to pass by itself (a full disk gets space back, an object store
    comes back): a live collector keeps sampling and retries at every flush instead of stopping.
    """

    def __init__(self, title: str, hint: str = "", *, passes: bool = False):
        super().__init__(title, hint)
        self.passes = passes


class InputError(CollectorError):
    """A file or an option the user gave cannot be used as it is."""


class GpuLost(CollectorError):
    """One GPU stopped answering NVML (GPU_IS_LOST and friends): record it, keep sampling the others."""
