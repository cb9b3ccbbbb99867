"""gpupool's libnvidia-ml.so.1: NVML tools inside a lease see the lease's slice (docs/remote.md,
"What tools see").

The shim is compiled from this tree; pynvml (nvidia-ml-py), gpustat and nvitop load it as they load
NVML, from the library path, in their own processes. The end-to-end tests run `gpuattach run` against
a server on simulated GPUs whose lease workers serve CUDA from host memory (the host executor).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from pool_harness import ServerProc, api, client_env, gpuattach

from server.api import Lease
from server.api import read as read_answer
from virtualize.client import _nvml_view, _nvmlgen
from virtualize.client.remote import NVML_MODULE, SHIM_MODULE, fresh_nvml

pytestmark = pytest.mark.timeout(120)
# gpuattach run uses the installed shims (pip install -e ., or setup.py build_ext --inplace)
needs_shims = pytest.mark.skipif(
    not all(importlib.util.find_spec(m) for m in (SHIM_MODULE, NVML_MODULE)), reason="the shims are not built"
)
ROOT = Path(__file__).resolve().parents[1]
PROBE = str(ROOT / "tests" / "nvml_probe.py")
MiB = 1 << 20
NVML_NOT_SUPPORTED, NVML_NO_PERMISSION, NVML_FUNCTION_NOT_FOUND = 3, 4, 13
PARTITION = 40 * 1024 * MiB
USED = 1536 * MiB

LEASE = {  # the server's answer to GET /v1/leases/ID, as JSON
    "id": "L-nvml",
    "client": "alice",
    "state": "active",
    "created_at": "2026-01-01T00:00:00Z",
    "expires_at": "2026-01-01T00:01:00Z",
    "ttl_s": 60.0,
    "simulated": False,
    "server": {"hostname": "gpu1", "addr": "10.0.0.1", "port": 56001, "version": "0", "simulated": False,
               "mps": False, "gpu_count": 8, "driver_version": "550.54.15", "cuda_version": "12.4"},
    "partitions": [
        {
            "gpu_index": 3,
            "gpu_uuid": "GPU-11111111-2222-3333-4444-555555555555",
            "gpu_name": "NVIDIA H100 80GB HBM3",
            "compute_capability": "9.0",
            "pci_bus_id": "00000000:19:00.0",
            "mem_bytes": PARTITION,
            "fraction": 0.5,
            "sm_share": None,
            "usage": {"mem_used_bytes": USED, "util_gpu": 0.37, "temperature_c": None, "power_w": 120.5,
                      "sm_clock_mhz": 1980},
        }
    ],
}  # fmt: skip


def render(lease: dict, pids, real_nvml=None) -> str:
    """The view of a lease answer, decoded as the client decodes it (server.api.Lease)."""
    return _nvml_view.render(read_answer(json.dumps(lease).encode(), Lease), pids, real_nvml)


@pytest.fixture(scope="module")
def nvml_dir(tmp_path_factory) -> Path:
    return fresh_nvml(tmp_path_factory.mktemp("nvml")).parent


def view_env(nvml_dir: Path, tmp_path: Path, lease=LEASE, pids=(4242,)) -> dict[str, str]:
    view = tmp_path / "view"
    _nvml_view.write(view, render(lease, list(pids)))
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
    env.update(LD_LIBRARY_PATH=str(nvml_dir), GPUPOOL_NVML_VIEW=str(view), COLUMNS="120")
    return env


def run(args, env, timeout=60) -> subprocess.CompletedProcess:
    return subprocess.run(args, env=env, capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def lines(out: str) -> dict[str, str]:
    return dict(line.split(" ", 1) for line in out.splitlines() if " " in line)


def test_every_nvml_function_pynvml_resolves_has_a_verdict_and_the_stubs_are_current():
    """Completeness by construction: every name pynvml looks up in the library is in the shim's names
    file with a verdict, and the generated stubs match pynvml and nvml_shim.c (else regenerate)."""
    table = dict(
        line.split() for line in _nvmlgen.NAMES_OUTPUT.read_text().splitlines() if not line.startswith("#")
    )
    missing = sorted(set(_nvmlgen.pynvml_names()) - set(table))
    assert not missing, f"no verdict for {missing[:5]}: run python -m virtualize.client._nvmlgen"
    assert set(table.values()) <= {"answer", "not_supported", "no_permission"}
    assert not _nvmlgen.stale(), "stale: run python -m virtualize.client._nvmlgen"
    assert table["nvmlDeviceGetMemoryInfo_v2"] == "answer"
    assert table["nvmlDeviceSetPowerManagementLimit"] == "no_permission"


def test_the_shim_exports_every_name_with_a_verdict(nvml_dir):
    """pynvml finds every function it may ask for (none is NVML_ERROR_FUNCTION_NOT_FOUND)."""
    import ctypes

    lib = ctypes.CDLL(str(nvml_dir / "libnvidia-ml.so.1"))
    absent = [n for n in _nvmlgen.verdicts() if not hasattr(lib, n)]
    assert not absent


def test_pynvml_every_device_query_answers_or_returns_a_documented_error(nvml_dir, tmp_path):
    """Each nvmlDeviceGet* of pynvml, called on the slice, answers or raises NOT_SUPPORTED /
    NO_PERMISSION (what a GPU without the feature says); the process never crashes and no function is
    missing."""
    out = run([sys.executable, PROBE, "every"], view_env(nvml_dir, tmp_path))
    assert out.returncode == 0, out.stderr
    results = json.loads(out.stdout)
    reached = {k: v for k, v in results.items() if not str(v).startswith("args")}
    assert len(reached) > 200  # pynvml has ~230 of them; a handful need arguments we cannot make up
    wrong = {k: v for k, v in reached.items() if v not in ("ok", NVML_NOT_SUPPORTED, NVML_NO_PERMISSION)}
    assert not wrong
    for answered in ("nvmlDeviceGetMemoryInfo", "nvmlDeviceGetName", "nvmlDeviceGetUUID",
                     "nvmlDeviceGetUtilizationRates", "nvmlDeviceGetComputeRunningProcesses",
                     "nvmlDeviceGetPciInfo", "nvmlDeviceGetCudaComputeCapability"):  # fmt: skip
        assert results[answered] == "ok", answered


def test_pynvml_sees_the_partition_and_what_the_lease_holds(nvml_dir, tmp_path):
    """Memory total = the partition (v1 and v2), used = the lease's, free = total - used; name, UUID,
    the real GPU's PCI bus id, lookups by UUID and bus id (NVML's and CUDA's spelling), utilization = the lease's share, the run's process; the GPU's
    SM clock, which is its graphics clock (torch.cuda.clock_rate() reads it: PyTorch's test_cuda.py failed on
    NOT_SUPPORTED); an unknown value (temperature, the memory clock) is NOT_SUPPORTED."""
    out = run([sys.executable, PROBE, "slice"], view_env(nvml_dir, tmp_path))
    assert out.returncode == 0, out.stderr
    got = lines(out.stdout)
    assert got["count"] == "1" and got["name"] == "NVIDIA H100 80GB HBM3"
    assert got["uuid"] == LEASE["partitions"][0]["gpu_uuid"]
    assert int(got["total"]) == int(got["total_v2"]) == PARTITION
    assert int(got["used"]) == int(got["used_v2"]) == USED
    assert int(got["free"]) == PARTITION - USED
    assert got["bus"] == "00000000:19:00.0"  # the real GPU's, as CUDA reports it
    assert got["by_uuid"] == got["by_bus"] == got["by_cuda_bus"] == "0"
    assert got["util"] == "37" and got["cc"] == "9.0" and got["driver"] == "550.54.15"
    assert got["processes"] == f"4242:{USED}"
    assert got["temperature"] == got["memory_clock"] == f"error {NVML_NOT_SUPPORTED}"
    assert got["sm_clock"] == got["graphics_clock"] == "1980"


EVENTS_AND_TABLE = """
import time, pynvml as N
N.nvmlInit(); h = N.nvmlDeviceGetHandleByIndex(0)
s = N.nvmlEventSetCreate()
N.nvmlDeviceRegisterEvents(h, N.nvmlEventTypeXidCriticalError, s)
print("types", N.nvmlDeviceGetSupportedEventTypes(h))
t = time.monotonic()
try:
    N.nvmlEventSetWait_v2(s, 200); print("wait returned")
except N.NVMLError as e:
    print("wait", e.value, round(time.monotonic() - t, 1))
N.nvmlEventSetFree(s)
print("display", N.nvmlDeviceGetDisplayMode(h), N.nvmlDeviceGetDisplayActive(h))
m = N.nvmlDeviceIsMigDeviceHandle(h); print("mig_handle", int(getattr(m, "value", m)))
"""


def test_nvidia_smis_table_can_start_events_and_display_columns(nvml_dir, tmp_path):
    """What the plain nvidia-smi table needs beyond --query-gpu: an event set is created and
    registered (the table stops with 255 when that fails), supports no event types, and a wait times
    out after the caller's timeout as on a GPU where nothing happened; no display is attached or
    active; the device is not a MIG device."""
    out = run([sys.executable, "-c", EVENTS_AND_TABLE], view_env(nvml_dir, tmp_path))
    assert out.returncode == 0, out.stderr
    got = lines(out.stdout)
    assert got["types"] == "0"
    timeout_code, waited = got["wait"].split()
    assert int(timeout_code) == 10 and 0.1 <= float(waited) < 2  # NVML_ERROR_TIMEOUT
    assert got["display"] == "0 0" and got["mig_handle"] == "0"


TABLE_STATE = """
import pynvml as N
N.nvmlInit(); h = N.nvmlDeviceGetHandleByIndex(0)
def show(name, call):
    try:
        v = call()
        print(name, " ".join(str(int(x)) for x in (v if isinstance(v, (list, tuple)) else [v])))
    except N.NVMLError as e:
        print(name, "error", e.value)
show("max_mig", lambda: N.nvmlDeviceGetMaxMigDeviceCount(h))
show("persistence", lambda: N.nvmlDeviceGetPersistenceMode(h))
show("ecc", lambda: N.nvmlDeviceGetEccMode(h))
show("fan", lambda: N.nvmlDeviceGetFanSpeed(h))
show("temperature_v", lambda: N.nvmlDeviceGetTemperatureV(h, N.NVML_TEMPERATURE_GPU))
show("temperature", lambda: N.nvmlDeviceGetTemperature(h, N.NVML_TEMPERATURE_GPU))
show("pstate", lambda: N.nvmlDeviceGetPerformanceState(h))
show("power_limit", lambda: N.nvmlDeviceGetEnforcedPowerLimit(h))
show("mig_mode", lambda: N.nvmlDeviceGetMigMode(h))
show("virtualization", lambda: N.nvmlDeviceGetVirtualizationMode(h))
"""


@pytest.mark.parametrize("temperature", [None, 41])
def test_nvidia_smis_table_state_columns_answer_as_a_gpu_without_the_feature(nvml_dir, tmp_path, temperature):
    """The state the plain nvidia-smi table reads (it exits 255 when one fails): no MIG devices and MIG
    disabled now and pending, persistence mode and ECC disabled, a bare-metal GPU (no vGPU), P0; no
    fan and no known power limit (NOT_SUPPORTED, never a made-up number); the versioned temperature
    equals the plain one, the view's when it has one, else NOT_SUPPORTED."""
    lease = json.loads(json.dumps(LEASE))
    lease["partitions"][0]["usage"]["temperature_c"] = temperature
    out = run([sys.executable, "-c", TABLE_STATE], view_env(nvml_dir, tmp_path, lease))
    assert out.returncode == 0, out.stderr
    got = lines(out.stdout)
    assert got["max_mig"] == "0" and got["mig_mode"] == "0 0"  # NVML_DEVICE_MIG_DISABLE
    assert got["persistence"] == "0" and got["ecc"] == "0 0"  # NVML_FEATURE_DISABLED
    assert got["virtualization"] == "0"  # NVML_GPU_VIRTUALIZATION_MODE_NONE
    assert got["pstate"] == "0"  # NVML_PSTATE_0
    assert got["fan"] == got["power_limit"] == f"error {NVML_NOT_SUPPORTED}"
    expected = f"error {NVML_NOT_SUPPORTED}" if temperature is None else str(temperature)
    assert got["temperature_v"] == got["temperature"] == expected


def test_the_view_is_reread_when_it_changes(nvml_dir, tmp_path):
    """A running tool sees the lease's usage move: the shim re-reads the view file after a rewrite."""
    env = view_env(nvml_dir, tmp_path)
    script = (
        "import pynvml as N, sys, time\n"
        "N.nvmlInit(); h = N.nvmlDeviceGetHandleByIndex(0)\n"
        "print(N.nvmlDeviceGetMemoryInfo(h).used, flush=True); sys.stdin.readline()\n"
        "print(N.nvmlDeviceGetMemoryInfo(h).used, flush=True)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert int(proc.stdout.readline()) == USED
        lease = json.loads(json.dumps(LEASE))
        lease["partitions"][0]["usage"]["mem_used_bytes"] = 3 * USED
        _nvml_view.write(Path(env["GPUPOOL_NVML_VIEW"]), render(lease, [4242]))
        proc.stdin.write("\n")
        proc.stdin.flush()
        assert int(proc.stdout.readline()) == 3 * USED
    finally:
        proc.kill()
        proc.wait()


def test_without_a_lease_view_nvml_says_the_driver_is_not_loaded(nvml_dir, tmp_path):
    """Loaded outside gpuattach run, the shim fails nvmlInit as NVML does on a machine without the
    driver (one line on stderr says why), never answers made-up numbers."""
    env = view_env(nvml_dir, tmp_path)
    del env["GPUPOOL_NVML_VIEW"]
    out = run([sys.executable, "-c", "import pynvml as N\ntry: N.nvmlInit()\nexcept N.NVMLError as e: print(e.value)"], env)  # fmt: skip
    assert out.stdout.strip() == "9"  # NVML_ERROR_DRIVER_NOT_LOADED
    assert "GPUPOOL_NVML_VIEW" in out.stderr


def test_gpustat_and_nvitop_show_the_slice(nvml_dir, tmp_path):
    """gpustat's JSON and nvitop's API report the partition as the GPU's memory and the lease's use."""
    env = view_env(nvml_dir, tmp_path)
    out = run([sys.executable, "-m", "gpustat", "--json"], env)
    assert out.returncode == 0, out.stderr
    gpu = json.loads(out.stdout)["gpus"][0]
    assert gpu["memory.total"] == PARTITION // MiB and gpu["memory.used"] == USED // MiB
    assert gpu["name"] == "NVIDIA H100 80GB HBM3" and gpu["utilization.gpu"] == 37
    script = (
        "from nvitop import Device\n"
        "d = Device.all()[0]\n"
        "print('total', d.memory_total()); print('used', d.memory_used()); print('util', d.gpu_utilization())\n"
    )
    out = run([sys.executable, "-c", script], env)
    assert out.returncode == 0, out.stderr
    got = lines(out.stdout)
    assert int(got["total"]) == PARTITION and int(got["used"]) == USED and got["util"] == "37"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = ServerProc(
        tmp_path_factory.mktemp("nvml-pool"), "2xH100-80GB", env={"GPUPOOL_WORKER_EXECUTOR": "host"}
    ).start()
    yield srv
    srv.stop()


def quarter_of_a_gpu(server) -> int:
    status, answer = api(server.url, "GET", "/v1/gpus", server.token("nvml-look"))
    assert status == 200
    return answer["gpus"][0]["mem_total_bytes"] // 4


@pytest.mark.slow
@needs_shims
def test_one_memory_size_everywhere_under_gpuattach_run(server, tmp_path):
    """Under `gpuattach run -p 0.25`: cuDeviceTotalMem, cuMemGetInfo's total and NVML's total are the
    partition; after the program allocates through the CUDA shim, NVML's used shows what the lease holds
    (from the worker, through the server) and lists the program's process."""
    env = client_env(tmp_path, [server.url], server.token("nvml-remote"))
    out = gpuattach("run", "-n", "1", "-p", "0.25", "--", sys.executable, PROBE, "cuda", "256",
                    env=env, timeout=90)  # fmt: skip
    assert out.returncode == 0, out.stderr
    got = {k: int(v) for k, v in lines(out.stdout).items()}
    quota = quarter_of_a_gpu(server)
    assert got["cuda_total"] == got["cuda_info_total"] == got["nvml_total"] == quota
    assert got["nvml_used_after"] >= 256 * MiB
    assert got["nvml_free_after"] == quota - got["nvml_used_after"]
    assert got["cuda_free_after"] <= quota - 256 * MiB
    assert got["nvml_processes"] == got["my_pid"]


def test_nvml_used_memory_follows_the_programs_allocations_at_once(nvml_dir, tmp_path):
    """In a remote run NVML's used memory is what the lease's worker holds at the call, once the process
    talks to it (torch.cuda.device_memory_used() right after an allocation sees it); before, the view's."""
    from remote_helpers import _compiled_shim, start_worker
    from test_remote_shim import client_env as shim_env

    from server.workers import WorkerDevice

    shim = _compiled_shim(tmp_path / "shim")
    worker = start_worker("nvml-lease", [WorkerDevice(0, "", 2048 * MiB)], bind_host="127.0.0.1", env={},
                          executor="host")  # fmt: skip
    try:
        env = {**shim_env(shim, worker), **{k: v for k, v in view_env(nvml_dir, tmp_path).items()
                                              if k.startswith("GPUPOOL_NVML")}}  # fmt: skip
        env["LD_LIBRARY_PATH"] = f"{shim}:{nvml_dir}"
        out = run([sys.executable, PROBE, "used_at_once", "256"], env)
    finally:
        worker.stop()
    assert out.returncode == 0, out.stderr
    got = {k: int(v) for k, v in lines(out.stdout).items()}
    assert got["used_before_cuda"] == USED  # the view's figure while the process has no connection
    assert got["used_connected"] == 0  # the lease holds nothing yet
    assert got["used_after_alloc"] == 256 * MiB
    assert got["free_after_alloc"] == got["total"] - 256 * MiB
    assert got["used_after_free"] == 0


@pytest.mark.slow
@needs_shims
def test_nccls_first_questions_of_a_two_gpu_lease_are_answered(server, tmp_path):
    """Under `gpuattach run -n 2`, what NCCL asks NVML before it starts and stops without: each GPU's
    compute capability, and the P2P read and write status of every pair of the lease's GPUs (a GPU with
    itself included), answered OK exactly where CUDA says the two reach each other."""
    env = client_env(tmp_path, [server.url], server.token("nvml-peers"))
    out = gpuattach("run", "-n", "2", "-p", "0.25", "--", sys.executable, PROBE, "peers", env=env, timeout=90)
    assert out.returncode == 0, out.stderr
    got = lines(out.stdout)
    assert got["count"] == "2"
    assert got["cc_0"] == got["cc_1"] != ""
    ok, not_supported = "0", "5"  # nvmlGpuP2PStatus_t: NVML_P2P_STATUS_OK, NVML_P2P_STATUS_NOT_SUPPORTED
    for a, b in ((0, 0), (1, 1)):
        assert got[f"p2p_{a}_{b}"].split()[:2] == [ok, ok]
    for a, b in ((0, 1), (1, 0)):
        read, write, can = got[f"p2p_{a}_{b}"].split()
        assert can in ("0", "1") and read == write == (ok if can == "1" else not_supported)


@needs_shims
def test_a_local_run_shows_the_same_slice(server, tmp_path):
    """`gpuattach run --local -p 0.25` gets the same NVML shim: the tools see the partition, not the GPU."""
    env = client_env(tmp_path, [server.url], server.token("nvml-local"))
    out = gpuattach("run", "--local", "-n", "1", "-p", "0.25", "--", sys.executable, PROBE, "slice",
                    env=env, timeout=60)  # fmt: skip
    assert out.returncode == 0, out.stderr
    got = lines(out.stdout)
    assert int(got["total"]) == quarter_of_a_gpu(server)
    assert got["name"].startswith("NVIDIA H100")


def test_the_collector_inside_a_lease_records_the_slice_labelled_as_a_lease(nvml_dir, tmp_path):
    """gpustat-collect run inside a lease records the partition as the GPU's memory, with its rows'
    source "lease", so no reader takes the slice for another physical GPU of this machine."""
    import pyarrow.dataset as ds

    env = view_env(nvml_dir, tmp_path)
    out = run([sys.executable, "-m", "collector.cli", "--out", str(tmp_path / "t"), "--interval", "0.5s",
               "--duration", "2s", "--flush", "1s", "-q"], env)  # fmt: skip
    assert out.returncode == 0, out.stderr
    rows = ds.dataset(tmp_path / "t", format="parquet", partitioning="hive").to_table().to_pylist()
    gpu_rows = [r for r in rows if r.get("mem_total_bytes") is not None]
    assert gpu_rows
    assert {r["source"] for r in gpu_rows} == {"lease"}
    assert {r["mem_total_bytes"] for r in gpu_rows} == {PARTITION}


SMI_TABLE = """
import ctypes, os, sys, uuid
lib = ctypes.CDLL("libnvidia-ml.so.1")
assert lib.nvmlInit_v2() == 0
table = ctypes.POINTER(ctypes.c_uint64)()
other = ctypes.POINTER(ctypes.c_uint64)()
print("other", lib.nvmlInternalGetExportTable(ctypes.byref(other), uuid.uuid4().bytes_le))
print("rc", lib.nvmlInternalGetExportTable(ctypes.byref(table), uuid.UUID("6c3efec4-8fc9-4e6c-a327-ee696e12f7c4").bytes_le))
print("size", table[0])
slot = lambda i: ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)(table[i])
handle = ctypes.c_void_p()
print("by_index", slot(81)(0, ctypes.addressof(handle), 0x22))
public = ctypes.c_void_p()
lib.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(public))
print("same_handle", handle.value == public.value)
capacity = ctypes.c_uint(4)
entries = ctypes.create_string_buffer(4 * 4128)
print("processes", slot(213)(handle, ctypes.addressof(capacity), ctypes.addressof(entries)))
print("count", capacity.value)
print("pid", int.from_bytes(entries.raw[0:4], "little"))
print("used", int.from_bytes(entries.raw[8:16], "little"))
print("name", entries.raw[32:4128].split(b"\\0")[0].decode())
other_count = ctypes.c_uint(99)
print("other_slot", slot(100)(handle, ctypes.addressof(other_count), None))
print("other_count", other_count.value)
"""


def test_nvidia_smi_private_table_finds_the_devices_and_lists_the_run(nvml_dir, tmp_path):
    """nvidia-smi finds devices and processes through NVML's private table, not the public calls: the
    shim answers it as the driver's NVML does (the ABI NVIDIA's own NVML mock recovered): the device
    handle by index, the run's process with its memory and name, zero for lists the lease does not
    have, and NOT_SUPPORTED for a table it does not know."""
    helper = subprocess.Popen(["sleep", "60"])  # the run's command, as the view names it
    try:
        out = run([sys.executable, "-c", SMI_TABLE], view_env(nvml_dir, tmp_path, pids=(helper.pid,)))
    finally:
        helper.kill()
        helper.wait()
    assert out.returncode == 0, out.stderr
    got = lines(out.stdout)
    assert got["other"] == str(NVML_NOT_SUPPORTED) and got["rc"] == "0" and int(got["size"]) > 648
    assert got["by_index"] == "0" and got["same_handle"] == "True"
    assert got["processes"] == "0" and got["count"] == "1"
    assert got["pid"] == str(helper.pid) and got["used"] == str(USED) and got["name"] == "sleep"
    assert got["other_slot"] == "0" and got["other_count"] == "0"


@pytest.fixture(scope="module")
def small_server(tmp_path_factory):
    """A pool of one small simulated GPU (4 GiB): a program can fill its partition in host memory."""
    srv = ServerProc(
        tmp_path_factory.mktemp("nvml-small"), "1xL4-4GB", env={"GPUPOOL_WORKER_EXECUTOR": "host"}
    ).start()
    yield srv
    srv.stop()


@pytest.mark.slow
@needs_shims
def test_a_program_that_takes_all_free_memory_gets_the_partition(small_server, tmp_path):
    """Allocating all the free memory cuMemGetInfo reports succeeds, one MiB more is
    CUDA_ERROR_OUT_OF_MEMORY, and NVML then shows the partition full (used = total, free = 0)."""
    env = client_env(tmp_path, [small_server.url], small_server.token("nvml-fill"))
    out = gpuattach("run", "-n", "1", "-p", "0.25", "--", sys.executable, PROBE, "fill", env=env, timeout=90)
    assert out.returncode == 0, out.stderr
    got = {k: int(v) for k, v in lines(out.stdout).items()}
    quota = quarter_of_a_gpu(small_server)
    assert got["cuda_total"] == got["nvml_total"] == quota
    assert got["cuda_free"] == quota  # nothing of the partition is taken before the program's own
    assert got["alloc_all"] == 0 and got["alloc_more"] == 2  # CUDA_ERROR_OUT_OF_MEMORY
    assert got["nvml_used"] == quota and got["nvml_free"] == 0


@pytest.mark.slow
@needs_shims
def test_pytorch_and_nvml_report_the_quota(small_server, tmp_path):
    """torch.cuda.mem_get_info's total, get_device_properties().total_memory (the runtime's
    totalGlobalMem, taken from the driver) and NVML's total are the partition."""
    pytest.importorskip("torch")
    env = client_env(tmp_path, [small_server.url], small_server.token("nvml-torch"))
    out = gpuattach(
        "run", "-n", "1", "-p", "0.25", "--", sys.executable, PROBE, "torch", env=env, timeout=120
    )
    assert out.returncode == 0, out.stderr
    got = {k: int(v) for k, v in lines(out.stdout).items()}
    assert got["torch_total"] == got["props_total"] == got["nvml_total"] == quarter_of_a_gpu(small_server)


# The GPU host's own NVML, at the seam where a --local run hands it the queries the lease does not
# answer: a library that answers only as the driver's would for a device handle it gave out. Its
# running processes, where STANDIN_OWN_BYTES is set: the compute list holds STANDIN_FOREIGN_PID
# (another tenant) with 64 GiB, the MPS list pid 1 (another MPS client) with 64 GiB, and the calling
# process with STANDIN_OWN_BYTES is in the list(s) STANDIN_OWN_IN names; unset, the queries fail.
HOST_NVML_C = r"""
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#define API __attribute__((visibility("default")))
static int device;
typedef struct { unsigned pid; unsigned long long used; unsigned gpu_instance, compute_instance; } proc_t;
static int procs(void *h, unsigned *count, proc_t *out, const char *list) {
    const char *own = getenv("STANDIN_OWN_BYTES"), *foreign = getenv("STANDIN_FOREIGN_PID");
    const char *own_in = getenv("STANDIN_OWN_IN");
    if (h != &device || !own || !foreign || !own_in) return 3;
    unsigned n = 1 + (strstr(own_in, list) != NULL);
    if (*count < n) { *count = n; return 7; }
    unsigned other = strcmp(list, "mps") ? (unsigned)atoi(foreign) : 1;
    out[0] = (proc_t){other, 64ULL << 30, ~0u, ~0u};
    if (n == 2) out[1] = (proc_t){(unsigned)getpid(), strtoull(own, NULL, 10), ~0u, ~0u};
    *count = n;
    return 0;
}
API int nvmlDeviceGetComputeRunningProcesses_v3(void *h, unsigned *n, proc_t *p) { return procs(h, n, p, "compute"); }
API int nvmlDeviceGetMPSComputeRunningProcesses_v3(void *h, unsigned *n, proc_t *p) { return procs(h, n, p, "mps"); }
API int nvmlInit_v2(void) { return 0; }
API int nvmlDeviceGetHandleByUUID(const char *uuid, void **h) {
    if (strcmp(uuid, "GPU-11111111-2222-3333-4444-555555555555")) return 6;
    *h = &device;
    return 0;
}
API int nvmlDeviceGetNvLinkState(void *h, unsigned link, unsigned *state) {
    if (h != &device) return 2;
    *state = link == 3;
    return 0;
}
API int nvmlDeviceGetMemoryInfo(void *h, unsigned long long *m) { m[0] = 1ULL << 40; return 0; }
API int nvmlDeviceSetPowerManagementLimit(void *h, unsigned limit) { return 0; }
API int nvmlDeviceGetPersistenceMode(void *h, unsigned *mode) { *mode = 1; return h == &device ? 0 : 2; }
API int nvmlDeviceGetEccMode(void *h, unsigned *now, unsigned *pending) { *now = *pending = 1; return 0; }
API int nvmlDeviceGetTemperatureV(void *h, int *t) { t[2] = 33; return 0; }
"""

LOCAL_QUERIES = """
import pynvml as N
N.nvmlInit(); h = N.nvmlDeviceGetHandleByIndex(0)
print("total", N.nvmlDeviceGetMemoryInfo(h).total)
print("used", N.nvmlDeviceGetMemoryInfo(h).used)
print("link3", N.nvmlDeviceGetNvLinkState(h, 3))
print("link0", N.nvmlDeviceGetNvLinkState(h, 0))
try:
    N.nvmlDeviceSetPowerManagementLimit(h, 100000)
    print("set ok")
except N.NVMLError as e:
    print("set", e.value)
print("persistence", N.nvmlDeviceGetPersistenceMode(h))
print("ecc", *N.nvmlDeviceGetEccMode(h))
print("temperature_v", N.nvmlDeviceGetTemperatureV(h, N.NVML_TEMPERATURE_GPU))
print("mig_mode", *N.nvmlDeviceGetMigMode(h))
"""


def host_nvml(tmp_path: Path) -> Path:
    """The stand-in GPU host's NVML (HOST_NVML_C), compiled."""
    import shutil

    host = tmp_path / "host"
    host.mkdir()
    source = host / "host_nvml.c"
    source.write_text(HOST_NVML_C)
    cc = shutil.which("cc") or shutil.which("gcc")
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(host / "libnvidia-ml.so.1"), str(source)], check=True)
    return host / "libnvidia-ml.so.1"


def local_view_env(nvml_dir: Path, tmp_path: Path, pids) -> dict[str, str]:
    """A --local run's environment: the view lists `pids` as the run's and names the host's NVML."""
    env = view_env(nvml_dir, tmp_path)
    _nvml_view.write(Path(env["GPUPOOL_NVML_VIEW"]), render(LEASE, pids, real_nvml=host_nvml(tmp_path)))
    return env


def test_a_local_run_asks_the_hosts_nvml_what_the_lease_does_not_answer(nvml_dir, tmp_path):
    """In a --local run the view names the GPU host's own NVML: queries the lease does not answer
    (NVLink here) reach it with its own device handle, the lease's numbers (memory) stay the lease's,
    and a change to the shared GPU is still refused (NO_PERMISSION), never handed on. The real GPU's
    state (persistence, ECC, a temperature the view lacks) is the host's; what the host lacks (MIG
    mode here) gets the lease's answer, not an error. Where the host cannot list its processes, used
    memory is the view's (the server's sample)."""
    env = local_view_env(nvml_dir, tmp_path, [4242])
    out = run([sys.executable, "-c", LOCAL_QUERIES], env)
    assert out.returncode == 0, out.stderr
    got = lines(out.stdout)
    assert int(got["total"]) == PARTITION
    assert int(got["used"]) == USED
    assert got["link3"] == "1" and got["link0"] == "0"
    assert got["set"] == str(NVML_NO_PERMISSION)
    assert got["persistence"] == "1" and got["ecc"] == "1 1" and got["temperature_v"] == "33"
    assert got["mig_mode"] == "0 0"


LIVE_USE = """
import os, pynvml as N
N.nvmlInit(); h = N.nvmlDeviceGetHandleByIndex(0)
m = N.nvmlDeviceGetMemoryInfo(h)
print("total", m.total)
print("used", m.used)
print("free", m.free)
print("used_v2", N.nvmlDeviceGetMemoryInfo(h, version=N.nvmlMemory_v2).used)
print("procs", *[f"{p.pid}:{p.usedGpuMemory}" for p in N.nvmlDeviceGetComputeRunningProcesses(h)])
print("me", os.getpid())
import ctypes, uuid  # nvidia-smi's process list: its private table's slot 213
lib, table = ctypes.CDLL("libnvidia-ml.so.1"), ctypes.POINTER(ctypes.c_uint64)()
lib.nvmlInternalGetExportTable(ctypes.byref(table), uuid.UUID("6c3efec4-8fc9-4e6c-a327-ee696e12f7c4").bytes_le)
count, entries = ctypes.c_uint(4), ctypes.create_string_buffer(4 * 4128)
ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)(table[213])(
    ctypes.cast(h, ctypes.c_void_p), ctypes.addressof(count), ctypes.addressof(entries))
print("smi_procs", *[f"{int.from_bytes(entries.raw[i * 4128:i * 4128 + 4], 'little')}:"
                     f"{int.from_bytes(entries.raw[i * 4128 + 8:i * 4128 + 16], 'little')}" for i in range(count.value)])
"""


@pytest.mark.parametrize(
    ("own", "listed_in"),
    [(256 * MiB, "compute,mps"), (256 * MiB, "compute"), (256 * MiB, "mps"), (2 * PARTITION, "compute,mps")],
    ids=["both-lists", "compute-list", "mps-list", "beyond-the-partition"],
)
def test_a_local_runs_used_memory_is_the_hosts_at_the_call(nvml_dir, tmp_path, own, listed_in):
    """In a --local run, used memory and the process list come from the host's NVML when asked, not
    from the server's sample (the view's USED, which lags): the run's processes, here a child started
    after the view named its parent, count with their bytes, whether the host lists them as compute
    processes, MPS clients or both (once); another tenant's process (the run's own parent) and another
    MPS client do not; used is clamped to the partition and free = total - used. nvidia-smi's own
    process list (its private table) says the same."""
    env = local_view_env(nvml_dir, tmp_path, [os.getpid()])
    env.update(STANDIN_OWN_BYTES=str(own), STANDIN_FOREIGN_PID=str(os.getppid()), STANDIN_OWN_IN=listed_in)
    out = run([sys.executable, "-c", LIVE_USE], env)
    assert out.returncode == 0, out.stderr
    got = lines(out.stdout)
    used = min(own, PARTITION)
    assert int(got["total"]) == PARTITION
    assert int(got["used"]) == int(got["used_v2"]) == used
    assert int(got["free"]) == PARTITION - used
    assert got["procs"] == got["smi_procs"] == f"{got['me']}:{used}"


def test_the_hosts_nvml_is_found_and_never_gpupools_own(nvml_dir, tmp_path):
    """gpuattach finds the driver's libnvidia-ml.so.1 on the library path for --local runs, passing
    over gpupool's own shim there."""
    from virtualize.client.remote import host_nvml

    host = tmp_path / "driver"
    host.mkdir()
    (host / "libnvidia-ml.so.1").write_bytes(b"")
    found = host_nvml({"LD_LIBRARY_PATH": f"{nvml_dir}:{host}"})
    assert found is not None and found.resolve() != (nvml_dir / "libnvidia-ml.so.1").resolve()
    if not subprocess.run(["ldconfig", "-p"], capture_output=True, text=True).stdout.count(
        "libnvidia-ml.so.1 ("
    ):
        assert found == host / "libnvidia-ml.so.1"


BUS = ["00000000:19:00.0", "00000000:1A:00.0"]
NVLINKED = {  # two H100s joined by links 0-3, as the server's NVML reported them (link 3's version unknown)
    **LEASE,
    "partitions": [
        {
            **LEASE["partitions"][0],
            "gpu_index": i,
            "gpu_uuid": f"GPU-{i}1111111-2222-3333-4444-555555555555",
            "pci_bus_id": BUS[i],
            "nvlinks": [
                {"link": k, "remote_pci_bus_id": BUS[1 - i], "version": None if k == 3 else 6}
                for k in range(4)
            ],
        }
        for i in range(2)
    ],
}
NVML_INVALID_ARGUMENT = 2
MAX_LINKS = 36  # pynvml's NVML_NVLINK_MAX_LINKS


def test_two_gpus_joined_by_nvlink_answer_as_the_hosts_nvml_does(nvml_dir, tmp_path):
    """The lease's NVLinks, from the view: each listed link is up (state, field value and P2P capability
    1), its remote PCI info names the other GPU, whose handle nvmlDeviceGetHandleByPciBusId finds (NCCL's
    walk counts four links to the peer), and the two report P2P status OK without asking CUDA; the version
    is the server's, NOT_SUPPORTED where it did not say;
    an unlisted link is down (0), one past NVML's most INVALID_ARGUMENT; other field values answer
    NOT_SUPPORTED in their own slot."""
    out = run([sys.executable, PROBE, "nvlinks"], view_env(nvml_dir, tmp_path, NVLINKED))
    assert out.returncode == 0, out.stderr
    got = lines(out.stdout)
    for d in range(2):
        assert got[f"nccl_{d}"] == f"{1 - d}:4"
        for k in range(4):
            assert (got[f"state_{d}_{k}"], got[f"cap_{d}_{k}"]) == ("1", "1")
            assert got[f"remote_{d}_{k}"] == BUS[1 - d]
        assert [got[f"version_{d}_{k}"] for k in range(4)] == ["6", "6", "6", f"error {NVML_NOT_SUPPORTED}"]
        for k in range(4, MAX_LINKS):
            assert (got[f"state_{d}_{k}"], got[f"cap_{d}_{k}"]) == ("0", "0")
            assert got[f"remote_{d}_{k}"] == f"error {NVML_NOT_SUPPORTED}"
        assert got[f"state_{d}_{MAX_LINKS}"] == f"error {NVML_INVALID_ARGUMENT}"
        assert got[f"c2c_{d}"] == str(NVML_NOT_SUPPORTED)
        # P2P status OK between the two NVLinked GPUs from the view alone (no CUDA driver in this process)
        assert got[f"p2p_{d}_{1 - d}"] == got[f"p2p_{d}_{d}"] == "0"


def test_a_gpu_the_view_gives_no_nvlink_answers_as_a_gpu_without_nvlink(nvml_dir, tmp_path):
    """Without nvlink lines (a simulated GPU, a GPU without NVLink) every NVLink query is NOT_SUPPORTED, as
    before, and NCCL's walk finds no link."""
    out = run([sys.executable, PROBE, "nvlinks"], view_env(nvml_dir, tmp_path))
    assert out.returncode == 0, out.stderr
    got = lines(out.stdout)
    assert got["nccl_0"] == ""
    for k in range(MAX_LINKS + 1):
        for query in ("state", "cap", "remote", "version"):
            assert got[f"{query}_0_{k}"] == f"error {NVML_NOT_SUPPORTED}", (query, k)


PCI_SIZES = """
import ctypes
lib = ctypes.CDLL("libnvidia-ml.so.1")
assert lib.nvmlInit_v2() == 0
h = ctypes.c_void_p()
assert lib.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(h)) == 0
for name, size in (("nvmlDeviceGetPciInfo", 32), ("nvmlDeviceGetPciInfo_v2", 52), ("nvmlDeviceGetPciInfo_v3", 68)):
    buf = ctypes.create_string_buffer(b"\\xab" * 256, 256)
    rc = getattr(lib, name)(h, buf)
    print(name, rc, buf.raw[:16].split(b"\\0")[0].decode(), buf.raw[size:] == b"\\xab" * (256 - size))
"""


def test_each_pci_info_version_fills_its_own_size_only(nvml_dir, tmp_path):
    """A C program calling the v1 or v2 PCI query with its own (smaller) struct gets it filled and
    nothing past it overwritten; each reports the bus id."""
    out = run([sys.executable, "-c", PCI_SIZES], view_env(nvml_dir, tmp_path))
    assert out.returncode == 0, out.stderr
    for line in out.stdout.splitlines():
        name, rc, bus, untouched = line.split()
        assert (rc, bus, untouched) == ("0", "0000:19:00.0", "True"), name


READ_ALL = """
import pynvml as N
try:
    N.nvmlInit()
except N.NVMLError as e:
    print("init", e.value)
    raise SystemExit(0)
for i in range(N.nvmlDeviceGetCount()):
    h = N.nvmlDeviceGetHandleByIndex(i)
    m = N.nvmlDeviceGetMemoryInfo(h)
    try:
        util = N.nvmlDeviceGetUtilizationRates(h).gpu
    except N.NVMLError_NotSupported:
        util = 0
    for link in range(N.NVML_NVLINK_MAX_LINKS + 1):  # whatever the nvlink lines held
        try:
            N.nvmlDeviceGetNvLinkRemotePciInfo(h, link)
            N.nvmlDeviceGetNvLinkVersion(h, link)
        except N.NVMLError:
            pass
    print("device", i, util, m.total, m.used, len(N.nvmlDeviceGetComputeRunningProcesses(h)))
"""

BAD_VIEWS = {
    "empty": "",
    "other format": "something else 1\ndevice 0\n",
    "no devices": "gpupool-nvml-view 1\nlease L\n",
    "device without memory": "gpupool-nvml-view 1\ndevice 0\nname X\nuuid GPU-1\n",
    "garbage numbers": "gpupool-nvml-view 1\ndevice 0\nuuid GPU-1\nmemory_total lots\nmemory_used -5\n",
    "used beyond total": "gpupool-nvml-view 1\ndevice 0\nuuid GPU-1\nmemory_total 1024\nmemory_used 4096\n",
    "out of range": "gpupool-nvml-view 1\ndevice 0\nuuid GPU-1\nmemory_total 1024\nutil_gpu_percent 250\n",
    "negative used": "gpupool-nvml-view 1\ndevice 0\nuuid GPU-1\nmemory_total 1024\nmemory_used -5\n",
    "overlong line": "gpupool-nvml-view 1\ndevice 0\nuuid GPU-1\nmemory_total 1024\nname "
    + "x" * 5000
    + "\n",
    "too many devices and processes": "gpupool-nvml-view 1\n"
    + "".join(f"device {i}\nuuid GPU-{i}\nmemory_total 1024\n" + "process 1 1\n" * 40 for i in range(40)),
    "binary": "gpupool-nvml-view 1\n\0\xff\xfe device \0 0\n",
    "bad nvlink lines": "gpupool-nvml-view 1\nnvlink 0 00000000:1A:00.0 6\ndevice 0\nuuid GPU-1\nmemory_total 1024\n"
    "nvlink -1 X\nnvlink 36 X\nnvlink 4294967296 X\nnvlink 0\nnvlink x y z\nnvlink 1 "
    + "b" * 500
    + " 6\n"
    + "nvlink 2 00000000:1A:00.0 6\n" * 100,
}


@pytest.mark.parametrize("case", sorted(BAD_VIEWS))
def test_a_damaged_view_never_crashes_a_tool(nvml_dir, tmp_path, case):
    """Whatever the view file holds, a tool gets either NVML's "driver not loaded" or devices with
    bounded values: never a crash, an overrun or a device without memory."""
    env = view_env(nvml_dir, tmp_path)
    Path(env["GPUPOOL_NVML_VIEW"]).write_text(BAD_VIEWS[case])
    out = run([sys.executable, "-c", READ_ALL], env)
    assert out.returncode == 0, out.stderr
    rows = out.stdout.splitlines()
    assert rows == ["init 9"] or (rows and all(r.startswith("device ") for r in rows)), rows
    for row in rows[1:] if rows == ["init 9"] else rows:
        *_, util, total, used, procs = row.split()
        assert 0 <= int(util) <= 100 and int(total) > 0 and 0 <= int(used) <= int(total) and int(procs) <= 16
