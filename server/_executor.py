"""The executor seam of a lease's worker: what actually runs the CUDA calls a client forwards.

Two executors plug in here: `server._cuda.CudaExecutor` (the real GPU through cuda-python) and
`server._executor_host.HostExecutor` (host memory, for tests on machines without a GPU). Both get
calls already checked by `server._executor_guard` (handles, pointers, quota), with plain ints, bytes
and memoryviews, and raise `CudaError` with the CUresult when CUDA says no.

Most methods carry the name of the CUDA call they execute, take its in-parameters in order (a name
as `str`, an image as `bytes`) and return its out-parameters (one value, a tuple, or None). The few
below with lower-case names are the shapes the wire needs: copies that stream chunk by chunk between
the socket and the device (the executor owns the buffers, so the CUDA one can use page-locked
memory and overlap the network with the DMA), memsets of any width,
launches with packed parameters, and a kernel's parameter layout.
"""

from __future__ import annotations

import abc
from collections.abc import Callable


class CudaError(Exception):
    """A CUDA call failed with `code` (a CUresult)."""

    def __init__(self, code: int, detail: str = "") -> None:
        super().__init__(f"CUresult {code}" + (f": {detail}" if detail else ""))
        self.code = int(code)


# CUresult values the worker uses itself.
INVALID_VALUE = 1
OUT_OF_MEMORY = 2
INVALID_CONTEXT = 201
INVALID_HANDLE = 400
NOT_FOUND = 500
NOT_SUPPORTED = 801


class Executor(abc.ABC):
    """Runs checked CUDA calls. Subclasses add one method per forwarded call named in `virtualize._calls`."""

    name = "executor"

    @abc.abstractmethod
    def set_context(self, ctx: int) -> None:
        """Make `ctx` (0: none) current on the calling thread."""

    @abc.abstractmethod
    def copy_to_device(
        self, dst: int, count: int, stream: int | None, fill: Callable[[memoryview], None]
    ) -> None:
        """Copy `count` bytes to device address `dst`, chunk by chunk: `fill(view)` puts the next
        len(view) bytes of the client's data into a buffer of the executor's. Stream None is the
        synchronous copy (done before the next call runs)."""

    @abc.abstractmethod
    def copy_from_device(
        self, src: int, count: int, stream: int | None, send: Callable[[memoryview], None]
    ) -> None:
        """Copy `count` bytes from device address `src`, handing each chunk to `send` in order,
        once the chunk's bytes are in host memory."""

    @abc.abstractmethod
    def memset(self, dst: int, value: int, element_size: int, count: int, stream: int | None) -> None: ...

    @abc.abstractmethod
    def param_layout(self, func: int, is_kernel: bool) -> list[tuple[int, int]]:
        """(offset, size) of each kernel parameter, in order."""

    @abc.abstractmethod
    def launch(
        self,
        func: int,
        grid: tuple[int, int, int],
        block: tuple[int, int, int],
        shared_mem: int,
        stream: int,
        params: bytes,
        layout: list[tuple[int, int]],
        attributes: list[tuple[int, bytes]],
    ) -> None:
        """Launch `func` with `params` packed at `layout`'s offsets and launch attributes (id, 64-byte value)."""

    def end_thread(self) -> None:  # noqa: B027 - optional hook
        """A connection's thread is done: release what the executor keeps for it."""

    def close(self) -> None:  # noqa: B027 - optional hook: most executors hold nothing to release
        """Release what the executor holds (the worker is ending)."""
