"""The lease guard's per-call rules that are data, read by the guard (`_executor_guard.Session`) and
generated into the worker's native loop (`virtualize/server/native/dispatch_gen.h`, by `virtualize.common._shimgen`),
so both paths apply one set: which wire arguments name device bytes, which copies a stream capture
refuses, and which calls the native loop serves. Handles are checked by their kind in the call table
(`Call.checked`).
"""

from __future__ import annotations

from virtualize.common._calls import BY_SYMBOL, CALLS, INTERNAL, Call

# Streams every context has, no lease's own: NULL, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD.
BUILTIN_STREAMS = frozenset({0, 1, 2})
# A stream's or a kernel node's attribute value (CUstreamAttrValue, CUkernelNodeAttrValue: 64 bytes), and
# the attribute that names memory, a range the guard checks (its base and length first).
ACCESS_POLICY_WINDOW, STREAM_ATTRIBUTE_BYTES = 1, 64
# The bytes one counted element of a range's length is (a memset counts 1-, 2- or 4-byte values); 1 where
# not named: the length is bytes.
ELEMENT_BYTES: dict[str, int] = {
    **dict.fromkeys(("cuMemsetD8_v2", "cuMemsetD8Async"), 1),
    **dict.fromkeys(("cuMemsetD16_v2", "cuMemsetD16Async"), 2),
    **dict.fromkeys(("cuMemsetD32_v2", "cuMemsetD32Async"), 4),
}
# The device bytes each copy or memset names, as (pointer, length) wire parameters: `Session._check_ranges`.
DEVICE_RANGES: dict[str, tuple[tuple[str, str], ...]] = {
    **dict.fromkeys(("cuMemcpyHtoD_v2", "cuMemcpyHtoDAsync_v2"), (("dst", "count"),)),
    **dict.fromkeys(("cuMemcpyDtoH_v2", "cuMemcpyDtoHAsync_v2", "gpMemcpyDtoHAsync"), (("src", "count"),)),
    "gpPinnedCopy": (("device", "count"),),
    "gpShmHtoD": (("dst", "count"),),
    "gpShmDtoH": (("src", "count"),),
    **dict.fromkeys(
        ("cuMemcpyDtoD_v2", "cuMemcpyDtoDAsync_v2", "cuMemcpyPeer", "cuMemcpyPeerAsync"),
        (("dst", "count"), ("src", "count")),
    ),
    **dict.fromkeys(ELEMENT_BYTES, (("dst", "count"),)),
    "cuTexRefSetAddress_v2": (("ptr", "bytes"),),  # the bytes a texture reference reads
}
# The client's page-locked memory shared with the worker (gpPinnedShare) each call names, as (address,
# length) wire parameters: `CopyCalls._pinned_at`.
PINNED_RANGES: dict[str, tuple[tuple[str, str], ...]] = {"gpPinnedCopy": (("host", "count"),)}
# Bytes at an offset of the memory a process on this host shares with its connection (gpShmAttach), as
# (offset, length) wire parameters: `CopyCalls.shm_htod`.
SHARED_RANGES: dict[str, tuple[tuple[str, str], ...]] = {"gpShmHtoD": (("offset", "count"),)}

# The calls the native loop serves, by exported symbol (an internal call by its name), with dispatch.c's
# name for each (C_LAUNCH ...), in C's order. The executor runs each as the call of the same name; a served call's every checked argument
# must be one the loop can check (the generator says which is not).
NATIVE_CALLS = {
    "cuLaunchKernelEx": "LAUNCH",
    "cuCtxSynchronize": "CTX_SYNC",
    "cuStreamSynchronize": "STREAM_SYNC",
    "cuStreamQuery": "STREAM_QUERY",
    "cuEventSynchronize": "EVENT_SYNC",
    "cuEventQuery": "EVENT_QUERY",
    "cuEventRecord": "EVENT_RECORD",
    "cuEventRecordWithFlags": "EVENT_RECORD_FLAGS",
    "cuStreamWaitEvent": "STREAM_WAIT_EVENT",
    "cuMemcpyHtoD_v2": "HTOD",
    "cuMemcpyHtoDAsync_v2": "HTOD_ASYNC",
    "cuMemcpyDtoH_v2": "DTOH",
    "cuMemcpyDtoHAsync_v2": "DTOH_ASYNC",
    "cuMemcpyDtoD_v2": "DTOD",
    "cuMemcpyDtoDAsync_v2": "DTOD_ASYNC",
    "gpPinnedCopy": "PINNED_COPY",
    "gpShmHtoD": "SHM_HTOD",
    "gpShmDtoH": "SHM_DTOH",
    "cuGraphLaunch": "GRAPH_LAUNCH",
    "cuEventElapsedTime": "EVENT_ELAPSED",
    "cuEventElapsedTime_v2": "EVENT_ELAPSED_V2",
    "cuMemsetD8_v2": "MEMSET_D8",
    "cuMemsetD16_v2": "MEMSET_D16",
    "cuMemsetD32_v2": "MEMSET_D32",
    "cuMemsetD8Async": "MEMSET_D8_ASYNC",
    "cuMemsetD16Async": "MEMSET_D16_ASYNC",
    "cuMemsetD32Async": "MEMSET_D32_ASYNC",
    "gpEventElapsedMany": "EVENT_ELAPSED_MANY",
    # An event the client names (gpEventCreateNamed) made here, and a named event destroyed here: the
    # guard's tables learn of both before Python next looks at the lease's events (NativeLease.settle_events).
    "gpEventCreateNamed": "EVENT_CREATE_NAMED",
    "cuEventDestroy_v2": "EVENT_DESTROY",
}
# Served calls whose C handler sends their answers itself, piece by piece (gpShmDtoH: one answer per piece
# of the copy as it lands), not one answered value of at most 8 bytes.
NATIVE_ANSWERED_IN_PIECES = frozenset({"gpShmDtoH"})


def capture_refuses(call: Call) -> bool:
    """Whether a stream capture cannot hold this copy between the client's memory and the GPU: the ones
    on a stream (`Session._capturing`; the native loop leaves them to Python on a capturing stream)."""
    return call.name.endswith("Async")


def range_positions(call: Call, rule: dict | None = None) -> tuple[tuple[int, int], ...]:
    """(pointer, length) positions in `call.ins` of the device bytes it names (DEVICE_RANGES), or of
    what another such rule (PINNED_RANGES) names."""
    names = [p.name for p in call.ins]
    pairs = (DEVICE_RANGES if rule is None else rule).get(
        call.name if call.symbol == "-" else call.symbol, ()
    )
    return tuple((names.index(ptr), names.index(length)) for ptr, length in pairs)


def element_bytes(call: Call) -> int:
    """The bytes one counted element of the call's range length is (ELEMENT_BYTES; 1: bytes)."""
    return ELEMENT_BYTES.get(call.name if call.symbol == "-" else call.symbol, 1)


def pinned_positions(call: Call) -> tuple[tuple[int, int], ...]:
    """(address, length) positions in `call.ins` of the client's shared page-locked bytes it names."""
    return range_positions(call, PINNED_RANGES)


def shared_positions(call: Call) -> tuple[tuple[int, int], ...]:
    """(offset, length) positions in `call.ins` of the bytes of the connection's shared memory it names."""
    return range_positions(call, SHARED_RANGES)


def native_calls() -> tuple[Call, ...]:
    """The calls the native loop serves, in C's order (its `which`)."""
    return tuple(call_named(name) for name in NATIVE_CALLS)


def call_named(name: str) -> Call:
    """The call a rule or a handler names (its exported symbol, or an internal call's name); a name the
    table lacks is a typo, said at import rather than never matching a request."""
    call = BY_SYMBOL.get(name) or INTERNAL.get(name)
    if call is None:
        raise ValueError(
            f"{name} is named by a guard rule or handler, but virtualize/common/_calls.py does not declare it"
        )
    return call


def _check_names() -> None:
    for name in (*DEVICE_RANGES, *NATIVE_CALLS):
        range_positions(call_named(name))  # every named parameter exists
    for name in PINNED_RANGES:
        pinned_positions(call_named(name))
    for name in SHARED_RANGES:
        shared_positions(call_named(name))


_check_names()
# by call id, for the guard's per-request lookup: (pointer, length, bytes per counted element)
RANGES_BY_ID = [tuple((*pair, element_bytes(c)) for pair in range_positions(c)) for c in CALLS]


def padded_params(params: bytes, layout) -> bytes:
    """A launch's parameters at least as long as the function's layout: the bytes an `extra` buffer
    leaves out are zero (NCCL declares a 4 KiB argument struct and sends the part its work uses; the
    driver then reads the layout's length, which must not run past what arrived)."""
    need = max((offset + size for offset, size in layout), default=0)
    return params if len(params) >= need else params + bytes(need - len(params))
