"""The one module that talks to NVML (through ``pynvml`` from nvidia-ml-py).

Every query goes through :func:`query`, field by field: a GPU that does not support one metric reports
``None`` for it and still reports the others. A GPU that stopped answering (fell off the bus) raises
:class:`GpuLost` so the caller can record it and keep sampling the other GPUs. Initialisation is
reference-counted under a lock, so the collector loop and the pool server's calls share one NVML
session, and it is shut down at exit.

Costs measured on an H100 (see DESIGN.md) decide what belongs in a tick: utilization, power and
temperature are microseconds; the energy counter is ~4 ms, so callers read it rarely.
"""

from __future__ import annotations

import atexit
import ctypes
import threading
from collections.abc import Callable
from typing import Any

import pynvml

from collector._errors import GpuLost, NvmlUnavailable
from collector._types import NvLink

# Errors that mean "this GPU is gone", not "this field is unsupported".
_LOST_CODES = frozenset(
    {pynvml.NVML_ERROR_GPU_IS_LOST, pynvml.NVML_ERROR_RESET_REQUIRED, pynvml.NVML_ERROR_GPU_NOT_FOUND}
)

# GPM metric ids (Hopper+), each reported by NVML in percent.
GPM_METRICS = {
    "sm_activity": pynvml.NVML_GPM_METRIC_SM_UTIL,
    "sm_occupancy": pynvml.NVML_GPM_METRIC_SM_OCCUPANCY,
    "tensor_activity": pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL,
    "dram_bw_util": pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL,
}


def query(func: Callable[..., Any], *args: Any, default: Any = None) -> Any:
    """Call one NVML function; ``default`` where the field is unsupported, GpuLost where the GPU is gone."""
    try:
        return func(*args)
    except pynvml.NVMLError as exc:
        if exc.value in _LOST_CODES:
            raise GpuLost(str(exc)) from exc
        return default


_lock = threading.Lock()
_refs = 0
_atexit_registered = False


def start() -> None:
    """Start NVML (once per process, reference-counted); raise NvmlUnavailable when it does not start."""
    global _refs, _atexit_registered
    with _lock:
        if _refs == 0:
            try:
                pynvml.nvmlInit()
            except pynvml.NVMLError as exc:
                raise NvmlUnavailable(_describe_init_error(exc)) from None
            except OSError as exc:  # a broken libnvidia-ml that ctypes cannot load
                raise NvmlUnavailable(str(exc)) from None
            if not _atexit_registered:
                atexit.register(_shutdown_at_exit)
                _atexit_registered = True
        _refs += 1


def stop() -> None:
    global _refs
    with _lock:
        if _refs == 0:
            return
        _refs -= 1
        if _refs == 0:
            query(pynvml.nvmlShutdown)


def _shutdown_at_exit() -> None:
    global _refs
    with _lock:
        if _refs:
            _refs = 0
            query(pynvml.nvmlShutdown)


def _describe_init_error(exc: pynvml.NVMLError) -> str:
    if exc.value == pynvml.NVML_ERROR_LIBRARY_NOT_FOUND:
        return "libnvidia-ml.so.1 not found"
    if exc.value == pynvml.NVML_ERROR_DRIVER_NOT_LOADED:
        return "the NVIDIA kernel driver is not loaded"
    if exc.value == pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH:
        return "driver/library version mismatch: reboot or reload the driver"
    return f"nvmlInit failed: {exc}"


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class NvmlBackend:
    """NVML for one process: devices by index, each query returning plain values or None.

    This is the seam the NVML source samples through; tests put a fake with the same methods in its
    place.
    """

    def __init__(self) -> None:
        self._handles: dict[int, Any] = {}

    # -- lifecycle and system ------------------------------------------------------------------
    def start(self) -> None:
        start()

    def stop(self) -> None:
        self._handles.clear()
        stop()

    def lease(self) -> str | None:
        """The gpupool lease whose slices this NVML shows (gpupool's libnvidia-ml.so.1 inside
        `gpuattach run`), None for the real NVML."""
        import ctypes

        probe = getattr(pynvml.nvmlLib, "gpupoolNvmlLease", None)
        if probe is None:
            return None
        probe.restype = ctypes.c_char_p
        return (probe() or b"").decode() or None

    def driver_version(self) -> str:
        return _text(query(pynvml.nvmlSystemGetDriverVersion, default="unknown"))

    def cuda_version(self) -> str:
        raw = query(pynvml.nvmlSystemGetCudaDriverVersion, default=None)
        return "unknown" if raw is None else f"{raw // 1000}.{raw % 1000 // 10}"

    def device_count(self) -> int:
        return int(query(pynvml.nvmlDeviceGetCount, default=0))

    def _handle(self, index: int) -> Any:
        handle = self._handles.get(index)
        if handle is None:
            handle = query(pynvml.nvmlDeviceGetHandleByIndex, index)
            if handle is None:
                raise GpuLost(f"no handle for GPU {index}")
            self._handles[index] = handle
        return handle

    # -- static facts ----------------------------------------------------------------------------
    def uuid(self, index: int) -> str | None:
        value = query(pynvml.nvmlDeviceGetUUID, self._handle(index))
        return None if value is None else _text(value)

    def pci_bus_id(self, index: int) -> str | None:
        info = query(pynvml.nvmlDeviceGetPciInfo, self._handle(index))
        return None if info is None else _text(info.busId)

    def nvlinks(self, index: int) -> list[NvLink]:
        """The GPU's active NVLinks, each with the bus id at its other end (what NCCL's topology reads).
        A GPU without NVLink answers NOT_SUPPORTED at link 0 and one past its last link
        INVALID_ARGUMENT (NVML_NVLINK_MAX_LINKS is the most any GPU has): either ends the list."""
        handle, links = self._handle(index), []
        for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
            try:
                if pynvml.nvmlDeviceGetNvLinkState(handle, link) != pynvml.NVML_FEATURE_ENABLED:
                    continue
                remote = _text(pynvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId)
            except pynvml.NVMLError as exc:
                if exc.value in _LOST_CODES:
                    raise GpuLost(str(exc)) from exc
                if exc.value in (pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_INVALID_ARGUMENT):
                    break
                continue  # this link cannot tell: the others still count
            version = query(pynvml.nvmlDeviceGetNvLinkVersion, handle, link)
            links.append(NvLink(link, remote, None if version is None else int(version)))
        return links

    def name(self, index: int) -> str | None:
        value = query(pynvml.nvmlDeviceGetName, self._handle(index))
        return None if value is None else _text(value)

    def compute_capability(self, index: int) -> tuple[int, int] | None:
        value = query(pynvml.nvmlDeviceGetCudaComputeCapability, self._handle(index))
        return None if value is None else (int(value[0]), int(value[1]))

    # -- per tick (microseconds each) ------------------------------------------------------------
    def memory(self, index: int) -> tuple[int, int] | None:
        info = query(pynvml.nvmlDeviceGetMemoryInfo, self._handle(index))
        return None if info is None else (int(info.used), int(info.total))

    def power_w(self, index: int) -> float | None:
        mw = query(pynvml.nvmlDeviceGetPowerUsage, self._handle(index))
        return None if mw is None else mw / 1000.0

    def temperature_c(self, index: int) -> float | None:
        value = query(pynvml.nvmlDeviceGetTemperature, self._handle(index), pynvml.NVML_TEMPERATURE_GPU)
        return None if value is None else float(value)

    def sm_clock_hz(self, index: int) -> float | None:
        mhz = query(pynvml.nvmlDeviceGetClockInfo, self._handle(index), pynvml.NVML_CLOCK_SM)
        return None if mhz is None else mhz * 1e6

    def utilization_samples(self, index: int, kind: str, since_us: int) -> list[tuple[int, float]] | None:
        """Driver samples newer than ``since_us`` as (timestamp µs, percent); None when unsupported.

        ``kind`` is "gpu" (utilization.gpu, a duty cycle) or "memory" (memory controller).
        """
        sampling = (
            pynvml.NVML_GPU_UTILIZATION_SAMPLES if kind == "gpu" else pynvml.NVML_MEMORY_UTILIZATION_SAMPLES
        )
        try:
            value_type, samples = _ring.samples(self._handle(index), sampling, since_us)
        except pynvml.NVMLError as exc:
            if exc.value in _LOST_CODES:
                raise GpuLost(str(exc)) from exc
            # NOT_FOUND: no sample newer than since_us yet (not an unsupported field).
            return [] if exc.value == pynvml.NVML_ERROR_NOT_FOUND else None
        field = _SAMPLE_FIELDS.get(value_type, "uiVal")
        return [(int(s.timeStamp), float(getattr(s.sampleValue, field))) for s in samples]

    def utilization_rates(self, index: int) -> tuple[float, float] | None:
        """Instantaneous (gpu %, memory %) for GPUs whose sample ring has nothing new."""
        rates = query(pynvml.nvmlDeviceGetUtilizationRates, self._handle(index))
        return None if rates is None else (float(rates.gpu), float(rates.memory))

    def energy_j(self, index: int) -> float | None:
        """Energy since the driver loaded; ~4 ms per call on an H100, so read it rarely."""
        mj = query(pynvml.nvmlDeviceGetTotalEnergyConsumption, self._handle(index))
        return None if mj is None else mj / 1000.0

    def processes(self, index: int) -> list[tuple[int, int | None]] | None:
        """(pid, GPU memory bytes or None) of compute and graphics processes; None when unsupported."""
        handle = self._handle(index)
        found: dict[int, int | None] = {}
        supported = False
        for func in (
            pynvml.nvmlDeviceGetComputeRunningProcesses,
            pynvml.nvmlDeviceGetGraphicsRunningProcesses,
        ):
            procs = query(func, handle)
            if procs is None:
                continue
            supported = True
            for p in procs:
                # A process in both lists reports the same memory in both: keep it once.
                used = None if p.usedGpuMemory is None else int(p.usedGpuMemory)
                prev = found.get(int(p.pid))
                found[int(p.pid)] = used if prev is None else max(prev, used or 0)
        return list(found.items()) if supported else None

    def process_utilization(self, index: int, since_us: int) -> list[tuple[int, int, float]] | None:
        """(pid, timestamp µs, SM busy percent) samples newer than ``since_us``; None when unsupported."""
        try:
            samples = _ring.process_utilization(self._handle(index), since_us)
        except pynvml.NVMLError as exc:
            if exc.value in _LOST_CODES:
                raise GpuLost(str(exc)) from exc
            # NOT_FOUND: no sample newer than since_us. SUCCESS: pynvml raises it when the size query
            # finds zero samples. Both mean "no process ran a kernel", not "unsupported".
            return [] if exc.value in (pynvml.NVML_ERROR_NOT_FOUND, pynvml.NVML_SUCCESS) else None
        return [(int(s.pid), int(s.timeStamp), float(s.smUtil)) for s in samples]

    # -- GPM (Hopper+) ---------------------------------------------------------------------------
    def gpm_supported(self, index: int) -> bool:
        support = query(pynvml.nvmlGpmQueryDeviceSupport, self._handle(index))
        return bool(support is not None and support.isSupportedDevice)

    def gpm_sample(self, index: int) -> Any | None:
        """Take a GPM sample (~39 µs); None when it fails. Free it with gpm_free."""
        sample = query(pynvml.nvmlGpmSampleAlloc)
        if sample is None:
            return None
        try:
            taken = query(pynvml.nvmlGpmSampleGet, self._handle(index), sample)
        except GpuLost:
            query(pynvml.nvmlGpmSampleFree, sample)
            raise
        if taken is None:
            query(pynvml.nvmlGpmSampleFree, sample)
            return None
        return sample

    def gpm_free(self, sample: Any) -> None:
        query(pynvml.nvmlGpmSampleFree, sample)

    def gpm_metrics(self, older: Any, newer: Any) -> dict[str, float | None]:
        """GPM metrics between two samples (≥ 100 ms apart), as ratios 0–1; None per failed metric."""
        request = pynvml.c_nvmlGpmMetricsGet_t()
        request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(GPM_METRICS)
        request.sample1 = older
        request.sample2 = newer
        for slot, metric_id in enumerate(GPM_METRICS.values()):
            request.metrics[slot].metricId = metric_id
        if query(pynvml.nvmlGpmMetricsGet, request) is None:
            return dict.fromkeys(GPM_METRICS)
        out: dict[str, float | None] = {}
        for slot, name in enumerate(GPM_METRICS):
            metric = request.metrics[slot]
            ok = metric.nvmlReturn == pynvml.NVML_SUCCESS
            out[name] = min(max(metric.value / 100.0, 0.0), 1.0) if ok else None
        return out


_SAMPLE_FIELDS = {
    pynvml.NVML_VALUE_TYPE_DOUBLE: "dVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
    pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal",
    pynvml.NVML_VALUE_TYPE_SIGNED_INT: "siVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_SHORT: "usVal",
}


class _RingReader:
    """The two sample-ring queries in one driver call each instead of pynvml's two.

    pynvml asks the driver for the sample count first and for the samples second; each call costs
    about as much as the whole query (~1.2 ms of CPU on an H200), so reading into a buffer sized for a
    full ring halves the collector's largest cost. Where that is refused (a driver or nvidia-ml-py
    that differs), it falls back to pynvml's own functions for good.
    """

    CAPACITY = 1024  # samples; a driver ring holds far fewer

    def __init__(self) -> None:
        self.direct = all(
            hasattr(pynvml, name)
            for name in (
                "_nvmlGetFunctionPointer",
                "c_nvmlSample_t",
                "_nvmlValueType_t",
                "_nvmlSamplingType_t",
            )
        )

    def samples(self, handle: Any, sampling: int, since_us: int) -> tuple[int, list]:
        if self.direct:
            buf = (pynvml.c_nvmlSample_t * self.CAPACITY)()
            count = ctypes.c_uint(self.CAPACITY)
            value_type = pynvml._nvmlValueType_t()
            fn = pynvml._nvmlGetFunctionPointer("nvmlDeviceGetSamples")
            ret = fn(
                handle,
                pynvml._nvmlSamplingType_t(sampling),
                ctypes.c_ulonglong(since_us),
                ctypes.byref(value_type),
                ctypes.byref(count),
                buf,
            )
            if ret == pynvml.NVML_SUCCESS:
                return value_type.value, buf[: count.value]
            if ret in (pynvml.NVML_ERROR_INVALID_ARGUMENT, pynvml.NVML_ERROR_INSUFFICIENT_SIZE):
                self.direct = False  # this driver wants the count asked first: pynvml's way from now on
            else:
                raise pynvml.NVMLError(ret)
        return pynvml.nvmlDeviceGetSamples(handle, sampling, since_us)

    def process_utilization(self, handle: Any, since_us: int) -> list:
        if self.direct and hasattr(pynvml, "c_nvmlProcessUtilizationSample_t"):
            buf = (pynvml.c_nvmlProcessUtilizationSample_t * self.CAPACITY)()
            count = ctypes.c_uint(self.CAPACITY)
            fn = pynvml._nvmlGetFunctionPointer("nvmlDeviceGetProcessUtilization")
            ret = fn(handle, buf, ctypes.byref(count), ctypes.c_ulonglong(since_us))
            if ret == pynvml.NVML_SUCCESS:
                return buf[: count.value]
            if ret not in (pynvml.NVML_ERROR_INVALID_ARGUMENT, pynvml.NVML_ERROR_INSUFFICIENT_SIZE):
                raise pynvml.NVMLError(ret)
        return pynvml.nvmlDeviceGetProcessUtilization(handle, since_us)


_ring = _RingReader()
