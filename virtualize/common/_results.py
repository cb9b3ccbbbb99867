"""CUresult codes, named once: what the shim, the worker and its executors answer with (cuda.h's numbering).

`CUresult.INVALID_VALUE` is the int 1; `.c_name` is cuda.h's name (`CUDA_ERROR_INVALID_VALUE`, what
`cuGetErrorName` returns) and `.text` cuda.h's description (what `cuGetErrorString` returns).
`virtualize.common._shimgen` writes the table into the shim's C. Only codes gpupool names itself are here.
"""

from __future__ import annotations

import enum


class CUresult(enum.IntEnum):
    text: str

    def __new__(cls, value: int, text: str) -> CUresult:
        member = int.__new__(cls, value)
        member._value_ = value
        member.text = text
        return member

    @property
    def c_name(self) -> str:
        return "CUDA_SUCCESS" if self is CUresult.SUCCESS else f"CUDA_ERROR_{self.name}"

    SUCCESS = 0, "no error"
    INVALID_VALUE = 1, "invalid argument"
    OUT_OF_MEMORY = 2, "out of memory"
    NOT_INITIALIZED = 3, "initialization error"
    DEINITIALIZED = 4, "driver shutting down"
    STUB_LIBRARY = 34, "CUDA driver is a stub library"
    DEVICE_UNAVAILABLE = 46, "CUDA-capable device(s) is/are busy or unavailable"
    NO_DEVICE = 100, "no CUDA-capable device is detected"
    INVALID_DEVICE = 101, "invalid device ordinal"
    INVALID_IMAGE = 200, "device kernel image is invalid"
    INVALID_CONTEXT = 201, "invalid device context"
    NO_BINARY_FOR_GPU = 209, "no kernel image is available for execution on the device"
    INVALID_PTX = 218, "a PTX JIT compilation failed"
    INVALID_SOURCE = 300, "device kernel image is invalid"
    FILE_NOT_FOUND = 301, "file not found"
    INVALID_HANDLE = 400, "invalid resource handle"
    NOT_FOUND = 500, "named symbol not found"
    NOT_READY = 600, "device not ready"
    ILLEGAL_ADDRESS = 700, "an illegal memory access was encountered"
    LAUNCH_OUT_OF_RESOURCES = 701, "too many resources requested for launch"
    LAUNCH_TIMEOUT = 702, "the launch timed out and was terminated"
    PEER_ACCESS_ALREADY_ENABLED = 704, "peer access is already enabled"
    PEER_ACCESS_NOT_ENABLED = 705, "peer access has not been enabled"
    ASSERT = 710, "device-side assert triggered"
    HOST_MEMORY_ALREADY_REGISTERED = 712, "part or all of the requested memory range is already mapped"
    HOST_MEMORY_NOT_REGISTERED = 713, "pointer does not correspond to a registered memory region"
    ILLEGAL_INSTRUCTION = 715, "an illegal instruction was encountered"
    MISALIGNED_ADDRESS = 716, "misaligned address"
    INVALID_ADDRESS_SPACE = 717, "operation not supported on global/shared address space"
    INVALID_PC = 718, "invalid program counter"
    LAUNCH_FAILED = 719, "unspecified launch failure"
    COOPERATIVE_LAUNCH_TOO_LARGE = 720, "too many blocks in cooperative launch"
    NOT_PERMITTED = 800, "operation not permitted"
    NOT_SUPPORTED = 801, "operation not supported"
    STREAM_CAPTURE_UNSUPPORTED = 900, "operation not permitted when stream is capturing"
    STREAM_CAPTURE_INVALIDATED = 901, "operation failed due to a previous error during capture"
    STREAM_CAPTURE_UNMATCHED = 903, "capture was not initiated in this stream"
    STREAM_CAPTURE_UNJOINED = 904, "capturing stream has unjoined work"
    STREAM_CAPTURE_IMPLICIT = (
        906,
        "operation would make the legacy stream depend on a capturing blocking stream",
    )
    INVALID_RESOURCE_TYPE = 914, "invalid resource type"
    INVALID_RESOURCE_CONFIGURATION = 915, "invalid resource configuration"
    GRAPH_RECAPTURE_FAILURE = 918, "a graph recapture failed and had to be terminated"
    UNKNOWN = 999, "unknown error"


RESULTS: dict[str, int] = {code.c_name: int(code) for code in CUresult}
RESULT_TEXT: dict[int, str] = {int(code): code.text for code in CUresult}
