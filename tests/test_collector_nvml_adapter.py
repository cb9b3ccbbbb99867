"""collector._nvml, the one module that calls pynvml: the only tests that stub pynvml itself."""

from __future__ import annotations

from types import SimpleNamespace

import pynvml
import pytest

from collector import _nvml
from collector._errors import GpuLost, NvmlUnavailable


def _raise(code):
    def fn(*args):
        raise pynvml.NVMLError(code)

    return fn


@pytest.fixture
def started(monkeypatch):
    """NVML 'started' with a stubbed init and one device handle."""
    monkeypatch.setattr(pynvml, "nvmlInit", lambda: None)
    monkeypatch.setattr(pynvml, "nvmlShutdown", lambda: None)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetHandleByIndex", lambda i: f"handle{i}")
    monkeypatch.setattr(_nvml, "_refs", 0)
    # No driver library behind the stubs: the ring reads take pynvml's own (stubbed) functions.
    monkeypatch.setattr(_nvml._ring, "direct", False)
    backend = _nvml.NvmlBackend()
    backend.start()
    yield backend
    backend.stop()


def test_query_maps_unsupported_to_default_and_lost_to_gpulost():
    assert _nvml.query(_raise(pynvml.NVML_ERROR_NOT_SUPPORTED), default="n/a") == "n/a"
    assert _nvml.query(_raise(pynvml.NVML_ERROR_NO_PERMISSION)) is None
    with pytest.raises(GpuLost):
        _nvml.query(_raise(pynvml.NVML_ERROR_GPU_IS_LOST))
    assert _nvml.query(lambda a, b: a + b, 2, 3) == 5


def test_nvml_that_does_not_start_is_one_clear_error(monkeypatch):
    monkeypatch.setattr(_nvml, "_refs", 0)
    monkeypatch.setattr(pynvml, "nvmlInit", _raise(pynvml.NVML_ERROR_DRIVER_NOT_LOADED))
    with pytest.raises(NvmlUnavailable) as info:
        _nvml.start()
    message = str(info.value)
    assert "no NVIDIA driver/NVML found" in message and "driver is not loaded" in message
    assert "--simulate N" in message and "\n" not in message


def test_a_field_one_gpu_lacks_is_none_the_others_still_read(started, monkeypatch):
    monkeypatch.setattr(pynvml, "nvmlDeviceGetPowerUsage", _raise(pynvml.NVML_ERROR_NOT_SUPPORTED))
    monkeypatch.setattr(pynvml, "nvmlDeviceGetMemoryInfo", lambda h: SimpleNamespace(used=5, total=80))
    monkeypatch.setattr(pynvml, "nvmlDeviceGetClockInfo", lambda h, clock: 1980)
    assert started.power_w(0) is None
    assert started.memory(0) == (5, 80)
    assert started.sm_clock_hz(0) == 1980e6


def test_a_lost_gpu_raises_gpulost(started, monkeypatch):
    monkeypatch.setattr(pynvml, "nvmlDeviceGetTemperature", _raise(pynvml.NVML_ERROR_GPU_IS_LOST))
    with pytest.raises(GpuLost):
        started.temperature_c(0)


def test_driver_samples_read_as_timestamp_and_percent(started, monkeypatch):
    seen = {}

    def samples(handle, kind, since):
        seen["args"] = (handle, kind, since)
        value = lambda v: SimpleNamespace(uiVal=v)  # noqa: E731
        return pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, [
            SimpleNamespace(timeStamp=10, sampleValue=value(40)),
            SimpleNamespace(timeStamp=20, sampleValue=value(60)),
        ]

    monkeypatch.setattr(pynvml, "nvmlDeviceGetSamples", samples)
    assert started.utilization_samples(0, "gpu", 5) == [(10, 40.0), (20, 60.0)]
    assert seen["args"] == ("handle0", pynvml.NVML_GPU_UTILIZATION_SAMPLES, 5)
    # NOT_FOUND means "nothing newer yet", which is not "unsupported"
    monkeypatch.setattr(pynvml, "nvmlDeviceGetSamples", _raise(pynvml.NVML_ERROR_NOT_FOUND))
    assert started.utilization_samples(0, "memory", 5) == []
    monkeypatch.setattr(pynvml, "nvmlDeviceGetSamples", _raise(pynvml.NVML_ERROR_NOT_SUPPORTED))
    assert started.utilization_samples(0, "memory", 5) is None


def test_processes_merge_compute_and_graphics_lists(started, monkeypatch):
    proc = lambda pid, mem: SimpleNamespace(pid=pid, usedGpuMemory=mem)  # noqa: E731
    monkeypatch.setattr(
        pynvml, "nvmlDeviceGetComputeRunningProcesses", lambda h: [proc(1, 100), proc(2, None)]
    )
    monkeypatch.setattr(pynvml, "nvmlDeviceGetGraphicsRunningProcesses", lambda h: [proc(1, 100), proc(3, 7)])
    assert sorted(started.processes(0)) == [(1, 100), (2, None), (3, 7)]
    monkeypatch.setattr(
        pynvml, "nvmlDeviceGetComputeRunningProcesses", _raise(pynvml.NVML_ERROR_NOT_SUPPORTED)
    )
    monkeypatch.setattr(
        pynvml, "nvmlDeviceGetGraphicsRunningProcesses", _raise(pynvml.NVML_ERROR_NOT_SUPPORTED)
    )
    assert started.processes(0) is None


def test_gpm_metrics_come_back_as_ratios_and_a_failed_metric_is_none(started, monkeypatch):
    def metrics_get(request):
        assert request.version == pynvml.NVML_GPM_METRICS_GET_VERSION and request.numMetrics == 4
        for slot in range(request.numMetrics):
            request.metrics[slot].nvmlReturn = pynvml.NVML_SUCCESS
            request.metrics[slot].value = 0.76 * (slot + 1)
        request.metrics[3].nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
        return request

    monkeypatch.setattr(pynvml, "nvmlGpmMetricsGet", metrics_get)
    got = started.gpm_metrics(pynvml.c_nvmlGpmSample_t(), pynvml.c_nvmlGpmSample_t())
    assert got["sm_activity"] == pytest.approx(0.0076)
    assert got["sm_occupancy"] == pytest.approx(0.0152)
    assert got["dram_bw_util"] is None


def test_on_this_machine_without_a_driver_the_public_api_says_so():
    # No stubs: the real pynvml on a machine with no NVIDIA driver (skipped where NVML starts).
    from collector import read_inventory

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass
    else:
        pynvml.nvmlShutdown()
        pytest.skip("NVML starts here")
    with pytest.raises(NvmlUnavailable, match="use --simulate N"):
        read_inventory()


def test_no_process_samples_is_an_empty_list_not_unsupported(started, monkeypatch):
    # pynvml raises NVMLError(SUCCESS) when the size query finds no sample at all
    monkeypatch.setattr(pynvml, "nvmlDeviceGetProcessUtilization", _raise(pynvml.NVML_SUCCESS))
    assert started.process_utilization(0, 0) == []
    monkeypatch.setattr(pynvml, "nvmlDeviceGetProcessUtilization", _raise(pynvml.NVML_ERROR_NOT_SUPPORTED))
    assert started.process_utilization(0, 0) is None


def _nvlink_gpu(monkeypatch, state, remote, version):
    """A stubbed GPU whose NVLink queries answer from `state`, `remote` and `version` (link -> value, or
    an NVMLError to raise); a link a table does not name is past the GPU's last (INVALID_ARGUMENT)."""

    def answer(table, link):
        value = table.get(link, pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT))
        if isinstance(value, pynvml.NVMLError):
            raise value
        return value

    monkeypatch.setattr(pynvml, "nvmlDeviceGetNvLinkState", lambda h, link: answer(state, link))
    monkeypatch.setattr(
        pynvml,
        "nvmlDeviceGetNvLinkRemotePciInfo",
        lambda h, link: SimpleNamespace(busId=answer(remote, link)),
    )
    monkeypatch.setattr(pynvml, "nvmlDeviceGetNvLinkVersion", lambda h, link: answer(version, link))


def test_a_gpus_active_nvlinks_are_read_with_the_bus_id_at_their_other_end(started, monkeypatch):
    """The inventory carries each active NVLink (link number, remote PCI bus id, version): links that are
    down are left out, one link whose query fails is skipped while the later ones still count, a version
    NVML does not tell is None, and the list ends at the GPU's last link."""
    from collector._inventory import inventory_from

    raise_ = pynvml.NVMLError
    state = {0: 1, 1: 1, 2: 0, 3: raise_(pynvml.NVML_ERROR_UNKNOWN), 4: 1}
    state.update({link: 0 for link in range(5, 18)})
    remote = {0: b"00000000:1A:00.0", 1: b"00000000:1A:00.0", 4: "00000000:2B:00.0"}
    version = {0: 6, 1: raise_(pynvml.NVML_ERROR_NOT_SUPPORTED), 4: 6}
    _nvlink_gpu(monkeypatch, state, remote, version)
    links = started.nvlinks(0)
    assert [(n.link, n.remote_pci_bus_id, n.version) for n in links] == [
        (0, "00000000:1A:00.0", 6),
        (1, "00000000:1A:00.0", None),
        (4, "00000000:2B:00.0", 6),
    ]
    monkeypatch.setattr(pynvml, "nvmlSystemGetDriverVersion", lambda: "580.65")
    monkeypatch.setattr(pynvml, "nvmlSystemGetCudaDriverVersion", lambda: 13000)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetCount", lambda: 1)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetMemoryInfo", lambda h: SimpleNamespace(used=0, total=80))
    monkeypatch.setattr(pynvml, "nvmlDeviceGetUUID", lambda h: "GPU-1")
    (gpu,) = inventory_from(started)
    assert gpu.nvlinks == tuple(links)


@pytest.mark.parametrize(
    "code", [pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND, pynvml.NVML_ERROR_UNKNOWN]
)
def test_a_gpu_whose_nvlink_queries_fail_has_no_nvlinks(started, monkeypatch, code):
    """A GPU without NVLink (NOT_SUPPORTED), an NVML without the functions, or one whose every NVLink query
    fails: no links, and the rest of the inventory still reads."""
    monkeypatch.setattr(pynvml, "nvmlDeviceGetNvLinkState", _raise(code))
    assert started.nvlinks(0) == []


def test_a_gpu_lost_while_its_nvlinks_are_read_raises_gpulost(started, monkeypatch):
    """A GPU that falls off the bus during the NVLink reading is lost, not a GPU without NVLink."""
    monkeypatch.setattr(pynvml, "nvmlDeviceGetNvLinkState", _raise(pynvml.NVML_ERROR_GPU_IS_LOST))
    with pytest.raises(GpuLost):
        started.nvlinks(0)
