"""Several processes of one run on one lease (a test runner's workers, a data loader): four processes
each hold a fifth of the device's memory at once, then three in turn each take nine tenths, which fits
only if each one's memory came back when it exited. Issue 11 saw such runs fail with
CUDA_ERROR_OUT_OF_MEMORY sooner than the partition's size explains.

Runs unchanged on a local GPU (a fifth of the GPU) or, under gpupool's libcuda.so.1, on a leased one
(a fifth of the partition); prints the same.
"""

from __future__ import annotations

import subprocess
import sys

from _common import loaded_libcuda
from cuda.bindings import driver as cu

CHILD = """
import sys
from cuda.bindings import driver as cu
def ok(r):
    if r[0] != cu.CUresult.CUDA_SUCCESS:
        print("failed", r[0].name, flush=True)
        sys.exit(1)
    return r[1] if len(r) == 2 else r[1:]
ok(cu.cuInit(0))
ok(cu.cuCtxSetCurrent(ok(cu.cuDevicePrimaryCtxRetain(ok(cu.cuDeviceGet(0))))))
free, total = ok(cu.cuMemGetInfo())
ok(cu.cuMemAlloc(int(total * float(sys.argv[1]))))
print("holding", flush=True)
sys.stdin.readline()
"""


def main() -> int:
    cu.cuInit(0)
    holders = [subprocess.Popen([sys.executable, "-c", CHILD, "0.2"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                text=True) for _ in range(4)]  # fmt: skip
    held = sum(p.stdout.readline().strip() == "holding" for p in holders)
    print("processes holding a fifth each at once", held, "of 4")
    for p in holders:
        p.communicate("\n", timeout=60)
    taken = 0
    for _ in range(3):
        one = subprocess.run([sys.executable, "-c", CHILD, "0.9"], input="\n", capture_output=True, text=True,
                             timeout=120)  # fmt: skip
        taken += one.stdout.strip() == "holding"
    print("processes in turn taking nine tenths", taken, "of 3")
    print("libcuda", loaded_libcuda(), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
