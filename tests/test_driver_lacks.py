"""The worker's question to its own driver at start: which ABIs of the call table it lacks, asked of a
stand-in libcuda.so.1 (built here) that answers cuGetProcAddress as a driver of a given age does."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from remote_helpers import needs_cc

ROOT = Path(__file__).resolve().parents[1]

# A driver that knows every name but those in FAKE_UNKNOWN; asked for a name at a version, it hands out
# that version's function, except for the names in FAKE_OLDER, whose newer ABIs it lacks: it hands out the
# same (older) function at every version, as a driver without a newer ABI does. It exports no cu* symbol
# but cuGetProcAddress_v2.
FAKE_DRIVER = r"""
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
static int listed(const char *env, const char *name) {
    const char *list = getenv(env);
    size_t n = strlen(name);
    for (const char *p = list; p && *p;) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len == n && strncmp(p, name, n) == 0) return 1;
        p = end ? end + 1 : NULL;
    }
    return 0;
}
int cuGetProcAddress_v2(const char *name, void **pfn, int version, uint64_t flags, int *status) {
    (void)flags;
    if (listed("FAKE_UNKNOWN", name)) {
        *pfn = NULL;
        if (status) *status = 1;
        return 500;
    }
    *pfn = (void *)(uintptr_t)(listed("FAKE_OLDER", name) ? 0x1000 : 0x1000 + version);
    if (status) *status = 0;
    return 0;
}
"""


def lacks_of(tmp_path: Path, unknown: str, older: str) -> list[str]:
    (tmp_path / "fake.c").write_text(FAKE_DRIVER)
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(tmp_path / "libcuda.so.1"), str(tmp_path / "fake.c")],
                   check=True, timeout=60)  # fmt: skip
    env = {**os.environ, "LD_LIBRARY_PATH": str(tmp_path), "PYTHONPATH": str(ROOT),
           "FAKE_UNKNOWN": unknown, "FAKE_OLDER": older}  # fmt: skip
    probe = (
        "from virtualize.server._cuda import CudaExecutor; print(','.join(CudaExecutor.driver_lacks(None)))"
    )
    proc = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().split(",")


@needs_cc
def test_the_worker_finds_each_abi_its_driver_lacks(tmp_path):
    """A name the driver does not know is lacked at every ABI; a newer ABI the driver hands out as its older
    function is lacked (cuMulticastBindMem's CUDA 13.1 one), the older one not; a newer ABI the shim serves
    itself of a name the driver has is not lacked (cuGraphAddNode_v3 on a driver with the _v2); every ABI
    the driver answers with its own function is there."""
    lacks = lacks_of(tmp_path, unknown="cuMemGetLocationInfo,cuLogsCurrent",
                     older="cuMulticastBindMem,cuGraphAddNode")  # fmt: skip
    assert {"cuMemGetLocationInfo@13041", "cuLogsCurrent@12090", "cuMulticastBindMem@13010"} <= set(lacks)
    assert "cuMulticastBindMem@12010" not in lacks
    assert not [entry for entry in lacks if entry.startswith("cuGraphAddNode@")]
    assert not [entry for entry in lacks if entry.startswith(("cuMemAlloc@", "cuMulticastBindAddr@"))]
