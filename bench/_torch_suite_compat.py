"""A pytest plugin for bench/framework_suites.py's PyTorch parts: a test file from a neighbouring release
runs on the installed PyTorch as it ran on its own.

Loaded with `-p _torch_suite_compat` for parts under `torch/`. PyTorch's test files are fetched from the
public repositories at the version nearest the GPU host's PyTorch that stores them, which is not always
the same release; where the installed `torch.testing._internal` changed a helper's signature since, the
helper accepts both forms here, with the older form's meaning at the time of the release that changed it.
"""

from __future__ import annotations


def pytest_configure(config) -> None:
    from torch.testing._internal import common_utils

    strict = common_utils.serialTest

    # Older test files write `@serialTest` bare, newer ones `@serialTest()`; the newer helper refuses a bare use
    # when the file is imported, which fails the whole file's collection.
    def serialTest(condition=True):
        return strict()(condition) if callable(condition) else strict(condition)

    common_utils.serialTest = serialTest
