"""The guard's launches: a kernel launch (its function and stream the lease's, its parameters as long as
the function's layout, its attributes as the shim sent them), a cluster occupancy asked with a launch's
configuration, a function's parameter layout, a linked image, and the elapsed times of many pairs of
events at once (what a benchmark harness asks after its launches). A function launched once here is then
launched by the native loop too (`NativeLease.learn`).
"""

from __future__ import annotations

import struct
from typing import ClassVar

from virtualize.common._calls import Call
from virtualize.common._wire import EVENT_ELAPSED, EVENT_PAIR, LAUNCH_ATTRIBUTE_BYTES, MAX_EVENT_PAIRS
from virtualize.server._executor import INVALID_HANDLE, INVALID_VALUE, MULTI_LAUNCH, CudaError, Launch
from virtualize.server._guard_concern import Concern
from virtualize.server._guard_rules import BUILTIN_STREAMS, padded_params

MULTI_DEVICE_FLAGS = 0x3  # CUDA_COOPERATIVE_LAUNCH_MULTI_DEVICE_NO_PRE_LAUNCH_SYNC, _NO_POST_LAUNCH_SYNC


def launch_attributes(raw: bytes) -> list[tuple[int, bytes]]:
    """A launch's attributes from its bulk: (CUlaunchAttributeID, its 64-byte value) each."""
    return [
        (struct.unpack_from("<i", raw, i)[0], raw[i + 8 : i + LAUNCH_ATTRIBUTE_BYTES])
        for i in range(0, len(raw) - LAUNCH_ATTRIBUTE_BYTES + 1, LAUNCH_ATTRIBUTE_BYTES)
    ]


class LaunchCalls(Concern):
    """Kernel launches and the questions asked about a launch."""

    CALLS: ClassVar[dict[str, str]] = {
        "gpParamLayout": "param_layout",
        "gpLinkImage": "link_image",
        "cuLaunchKernelEx": "launch",
        "cuLaunchCooperativeKernelMultiDevice": "launch_multi_device",
        "cuOccupancyMaxActiveClusters": "cluster_occupancy",
        "cuOccupancyMaxPotentialClusterSize": "cluster_occupancy",
        "gpEventElapsedMany": "elapsed_many",
    }

    def elapsed_many(self, call: Call, ins: tuple):
        """The elapsed time of each (start, end) pair, each answered on its own as cuEventElapsedTime
        answers it: an event not the lease's is INVALID_HANDLE and never reaches the driver. The native
        loop serves it the same way (dispatch.c elapsed_many)."""
        (count,) = ins
        if not 0 < count <= MAX_EVENT_PAIRS or self.session.channel.bulk_left != count * EVENT_PAIR.size:
            raise CudaError(INVALID_VALUE, "event pairs")
        pairs = self.session.channel.read_bulk(limit=MAX_EVENT_PAIRS * EVENT_PAIR.size)
        events, answers = self.session.lease.handles["event"], bytearray()
        for start, end in EVENT_PAIR.iter_unpack(pairs):
            result, ms = INVALID_HANDLE, 0.0
            if start in events and end in events:
                try:
                    result, ms = 0, self.session.executor.cuEventElapsedTime(start, end)
                except CudaError as exc:
                    result = exc.code
            answers += EVENT_ELAPSED.pack(result, ms)
        return b"", bytes(answers)

    def param_layout(self, call: Call, ins: tuple):
        self.session._check(call, ins)
        layout = self.session._layout(ins[0])
        flat = [x for pair in layout for x in pair]
        return struct.pack("<I", len(layout)), struct.pack(f"<{len(flat)}I", *flat)

    def link_image(self, call: Call, ins: tuple):
        self.session._check(call, ins)
        return b"", self.session.executor.gpLinkImage(*ins)  # the bytes as they are (not a NUL-padded string)

    def _check_launch(self, func: int, stream: int) -> None:
        handles = self.session.lease.handles
        if func not in handles["func"] and func not in handles["kernel"]:
            raise CudaError(INVALID_HANDLE, "function")
        if stream not in BUILTIN_STREAMS and stream not in handles["stream"]:
            raise CudaError(INVALID_HANDLE, "stream")

    def cluster_occupancy(self, call: Call, ins: tuple):
        func, gx, gy, gz, bx, by, bz, smem, stream, n_attrs = ins
        self._check_launch(func, stream)
        raw = self.session.channel.read_bulk(limit=64 * LAUNCH_ATTRIBUTE_BYTES)
        if len(raw) != n_attrs * LAUNCH_ATTRIBUTE_BYTES:
            raise CudaError(INVALID_VALUE, "launch attributes")
        config = Launch(
            func, (gx, gy, gz), (bx, by, bz), smem, stream, b"", [], tuple(launch_attributes(raw))
        )
        return struct.pack("<i", self.session.executor.cluster_occupancy(call.name, config)), b""

    def launch(self, call: Call, ins: tuple):
        func, gx, gy, gz, bx, by, bz, smem, stream = ins[:9]
        self._check_launch(func, stream)
        n_attrs = ins[9] if len(ins) > 9 else 0
        bulk = self.session.channel.read_bulk(limit=1 << 20)
        layout = self.session.lease.layouts.get(func)
        if layout is None:
            layout = self.session._layout(func)
        split = len(bulk) - n_attrs * LAUNCH_ATTRIBUTE_BYTES
        if split < 0:
            raise CudaError(INVALID_VALUE, "launch attributes")
        params, raw = bulk[:split], bulk[split:]
        params = padded_params(params, layout)
        attributes = tuple(launch_attributes(raw))
        self.session.executor.launch(
            Launch(func, (gx, gy, gz), (bx, by, bz), smem, stream, params, layout, attributes)
        )
        if (
            self.session.lease.native is not None
        ):  # checked and launched once: the native loop may launch it now
            self.session.lease.native.learn(func, layout)
        return None

    def launch_multi_device(self, call: Call, ins: tuple):
        """Each device's launch (its function and stream the lease's, its parameters as long as its layout),
        at most one per device of the lease, all checked before any is sent."""
        count, flags = ins
        if not 1 <= count <= len(self.session.lease.limits) or flags & ~MULTI_DEVICE_FLAGS:
            raise CudaError(INVALID_VALUE, "a launch per device of the lease, known flags")
        bulk = self.session.channel.read_bulk(limit=count * (MULTI_LAUNCH.size + (1 << 16)))
        launches, at = [], 0
        for _ in range(count):
            if at + MULTI_LAUNCH.size > len(bulk):
                raise CudaError(INVALID_VALUE, "the launches")
            func, gx, gy, gz, bx, by, bz, smem, length, stream = MULTI_LAUNCH.unpack_from(bulk, at)
            self._check_launch(func, stream)
            params = bulk[at + MULTI_LAUNCH.size : at + MULTI_LAUNCH.size + length]
            at += MULTI_LAUNCH.size + length
            layout = self.session._layout(func)
            launches.append(
                Launch(func, (gx, gy, gz), (bx, by, bz), smem, stream, padded_params(params, layout), layout,
                       is_kernel=func in self.session.lease.handles["kernel"])
            )  # fmt: skip
        if at != len(bulk):
            raise CudaError(INVALID_VALUE, "the launches")
        self.session.executor.launch_multi_device(launches, flags)
