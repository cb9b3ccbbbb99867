"""Kernel output: a numba-cuda kernel's print, between the program's own prints around a synchronise.

Natively the driver writes what the kernel printed when the program synchronises; remotely the worker
sends it ahead of that synchronise's reply. The output must read the same, line for line.
"""

from __future__ import annotations

import sys

from _common import loaded_libcuda
from numba import cuda


@cuda.jit
def speak(n):
    if cuda.grid(1) == 0:  # one thread: its lines come out in order
        for k in range(n):
            print("kernel line", k, "of", n)


def main() -> int:
    print("before launch", flush=True)
    speak[1, 32](3)
    print("before synchronize", flush=True)
    cuda.synchronize()
    print("after synchronize", flush=True)
    print("libcuda", loaded_libcuda(), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
