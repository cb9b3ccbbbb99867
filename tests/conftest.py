"""Shared test set-up: the `gpu` marker skips cleanly where NVML does not start; the `needs` marker
fails a test whose system tool is missing (``tests/required_tools.py``) unless
GPUPOOL_ALLOW_MISSING_TOOLS=1 lets it skip."""

from __future__ import annotations

import functools

import pytest
import required_tools


@functools.cache
def nvml_unavailable_reason() -> str | None:
    """None when NVML starts on this machine, else why it does not."""
    try:
        import pynvml
    except ImportError as exc:  # pragma: no cover - nvidia-ml-py is a core dependency
        return f"nvidia-ml-py not importable: {exc}"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return f"NVML does not start here ({exc}); run on a GPU machine: pytest tests/gpu"
    try:
        if pynvml.nvmlDeviceGetCount() == 0:
            return "NVML started but sees no GPU"
    finally:
        pynvml.nvmlShutdown()
    return None


def pytest_collection_modifyitems(config, items):
    reason = None
    for item in items:
        if item.get_closest_marker("gpu") is None:
            continue
        reason = reason or nvml_unavailable_reason()
        if reason:
            item.add_marker(pytest.mark.skip(reason=reason))


def pytest_runtest_setup(item):
    for marker in item.iter_markers("needs"):
        for name in marker.args:
            required_tools.require(name)
