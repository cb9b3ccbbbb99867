"""What NVML shows a program: run with gpupool's libnvidia-ml.so.1 first on the library path.

python tests/nvml_probe.py every     # call every nvmlDeviceGet* pynvml has on device 0: one JSON line
                                      # {name: "ok" | NVML error code | "args: …"} per function
python tests/nvml_probe.py slice     # the answered values of device 0 as `name value` lines
python tests/nvml_probe.py nvlinks   # each device's NVLink answers, and the topology NCCL's walk finds
python tests/nvml_probe.py cuda MiB  # (under gpuattach run) CUDA's and NVML's memory sizes, then
                                      # allocate MiB through the CUDA shim and wait for NVML to show it
"""

from __future__ import annotations

import inspect
import json
import sys
import time

import pynvml as N


def every() -> None:
    N.nvmlInit()
    handle = N.nvmlDeviceGetHandleByIndex(0)
    results = {}
    for name, fn in sorted(vars(N).items()):
        if not (name.startswith("nvmlDeviceGet") and callable(fn)):
            continue
        params = list(inspect.signature(fn).parameters.values())
        # The handle first, then the handle again for a further device (nvmlDeviceGetP2PStatus's second)
        # and 0 for each other required argument (a sensor, an index, a type).
        args = [handle] + [
            handle if "device" in p.name.lower() else 0
            for p in params[1:]
            if p.default is inspect.Parameter.empty
        ]
        try:
            fn(*args)
            results[name] = "ok"
        except N.NVMLError as exc:
            results[name] = exc.value
        except Exception as exc:  # pynvml's own handling of a made-up argument: never reached the library
            results[name] = f"args: {type(exc).__name__}"
    print(json.dumps(results))
    N.nvmlShutdown()


def slice_() -> None:
    N.nvmlInit()
    h = N.nvmlDeviceGetHandleByIndex(0)
    mem = N.nvmlDeviceGetMemoryInfo(h)
    mem2 = N.nvmlDeviceGetMemoryInfo(h, version=N.nvmlMemory_v2)
    out = {
        "count": N.nvmlDeviceGetCount(),
        "name": N.nvmlDeviceGetName(h),
        "uuid": N.nvmlDeviceGetUUID(h),
        "total": mem.total,
        "used": mem.used,
        "free": mem.free,
        "total_v2": mem2.total,
        "used_v2": mem2.used,
        "by_uuid": N.nvmlDeviceGetIndex(N.nvmlDeviceGetHandleByUUID(N.nvmlDeviceGetUUID(h))),
        "bus": N.nvmlDeviceGetPciInfo(h).busId,
        "by_bus": N.nvmlDeviceGetIndex(N.nvmlDeviceGetHandleByPciBusId(N.nvmlDeviceGetPciInfo(h).busId)),
        # the form cuDeviceGetPCIBusId (and so NCCL) uses: a 4-digit domain, lower case
        "by_cuda_bus": N.nvmlDeviceGetIndex(
            N.nvmlDeviceGetHandleByPciBusId(N.nvmlDeviceGetPciInfo(h).busIdLegacy.lower())
        ),
        "cc": ".".join(map(str, N.nvmlDeviceGetCudaComputeCapability(h))),
        "processes": ",".join(
            f"{p.pid}:{p.usedGpuMemory}" for p in N.nvmlDeviceGetComputeRunningProcesses(h)
        ),
        "driver": N.nvmlSystemGetDriverVersion(),
    }
    for key, call in (("util", lambda: N.nvmlDeviceGetUtilizationRates(h).gpu),
                      ("temperature", lambda: N.nvmlDeviceGetTemperature(h, N.NVML_TEMPERATURE_GPU)),
                      ("sm_clock", lambda: N.nvmlDeviceGetClockInfo(h, N.NVML_CLOCK_SM)),
                      ("graphics_clock", lambda: N.nvmlDeviceGetClockInfo(h, N.NVML_CLOCK_GRAPHICS)),
                      ("memory_clock", lambda: N.nvmlDeviceGetClockInfo(h, N.NVML_CLOCK_MEM))):  # fmt: skip
        try:
            out[key] = call()
        except N.NVMLError as exc:
            out[key] = f"error {exc.value}"
    for key, value in out.items():
        print(key, value, flush=True)
    N.nvmlShutdown()


def cuda(mib: int) -> None:
    """CUDA's sizes (the shim's, from the worker) next to NVML's, before and after an allocation."""
    import ctypes

    sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent))
    import remote_client as rc

    rc.check(rc.cu.cuInit(0), "cuInit")
    total = ctypes.c_uint64()
    rc.check(rc.cu.cuDeviceTotalMem(ctypes.byref(total), 0), "total")
    rc.setup()
    free, info_total = ctypes.c_uint64(), ctypes.c_uint64()
    rc.check(rc.cu.cuMemGetInfo(ctypes.byref(free), ctypes.byref(info_total)), "info")
    N.nvmlInit()
    h = N.nvmlDeviceGetHandleByIndex(0)
    print("cuda_total", total.value)
    print("cuda_info_total", info_total.value)
    print("nvml_total", N.nvmlDeviceGetMemoryInfo(h).total)
    rc.check(rc.alloc(mib << 20)[0], "alloc")
    rc.check(rc.cu.cuMemGetInfo(ctypes.byref(free), ctypes.byref(info_total)), "info")
    print("cuda_free_after", free.value)
    deadline = time.monotonic() + 15
    mem = N.nvmlDeviceGetMemoryInfo(h)
    while mem.used < mib << 20 and time.monotonic() < deadline:  # the view is refreshed every second
        time.sleep(0.2)
        mem = N.nvmlDeviceGetMemoryInfo(h)
    print("nvml_used_after", mem.used)
    print("nvml_free_after", mem.free)
    print("nvml_processes", ",".join(str(p.pid) for p in N.nvmlDeviceGetComputeRunningProcesses(h)))
    print("my_pid", __import__("os").getpid(), flush=True)


def used_at_once(mib: int) -> None:
    """NVML's used memory before CUDA connects, then right after an allocation and right after its free:
    no waiting for the view's refresh."""
    import ctypes

    sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent))
    import remote_client as rc

    N.nvmlInit()
    h = N.nvmlDeviceGetHandleByIndex(0)
    print("used_before_cuda", N.nvmlDeviceGetMemoryInfo(h).used)
    rc.setup()
    print("used_connected", N.nvmlDeviceGetMemoryInfo(h).used)
    rc_, ptr = rc.alloc(mib << 20)
    rc.check(rc_, "alloc")
    info = N.nvmlDeviceGetMemoryInfo(h)
    print("used_after_alloc", info.used)
    print("free_after_alloc", info.free)
    print("total", info.total)
    rc.check(rc.cu.cuMemFree(ctypes.c_uint64(ptr)), "free")
    print("used_after_free", N.nvmlDeviceGetMemoryInfo(h).used, flush=True)


def peers() -> None:
    """What NCCL asks NVML of every pair of GPUs before it starts (P2P read and write status), next to
    CUDA's cuDeviceCanAccessPeer for the same pair; and each GPU's compute capability."""
    import ctypes

    sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent))
    import remote_client as rc

    rc.check(rc.cu.cuInit(0), "cuInit")
    N.nvmlInit()
    count = N.nvmlDeviceGetCount()
    print("count", count)
    for a in range(count):
        major, minor = N.nvmlDeviceGetCudaComputeCapability(N.nvmlDeviceGetHandleByIndex(a))
        print(f"cc_{a}", f"{major}.{minor}")
        for b in range(count):
            ha, hb = N.nvmlDeviceGetHandleByIndex(a), N.nvmlDeviceGetHandleByIndex(b)
            read = N.nvmlDeviceGetP2PStatus(ha, hb, 0)  # NVML_P2P_CAPS_INDEX_READ
            write = N.nvmlDeviceGetP2PStatus(ha, hb, 1)  # NVML_P2P_CAPS_INDEX_WRITE
            can = ctypes.c_int(-1)
            if a != b:
                rc.check(rc.cu.cuDeviceCanAccessPeer(ctypes.byref(can), a, b), "cuDeviceCanAccessPeer")
            print(f"p2p_{a}_{b}", read, write, can.value, flush=True)


def _answer(call, *args):
    try:
        return call(*args)
    except N.NVMLError as exc:
        return f"error {exc.value}"


def nvlinks() -> None:
    """Per device and link: state, P2P capability, remote bus id, version (or `error CODE`), link 0 to
    one past NVML's most; then NCCL's own walk (ncclTopoGetXmlFromGpu): for links 0-17, the P2P
    capability, the state through the field values (sm_90), the remote PCI info through the name without
    a suffix, its lower-case bus id looked up with nvmlDeviceGetHandleByPciBusId: `nccl_D PEER:COUNT`."""
    import ctypes

    N.nvmlInit()
    P2P = N.NVML_NVLINK_CAP_P2P_SUPPORTED
    lib = N.nvmlLib  # the library pynvml loaded: the one on the library path
    for d in range(N.nvmlDeviceGetCount()):
        h = N.nvmlDeviceGetHandleByIndex(d)
        for link in range(N.NVML_NVLINK_MAX_LINKS + 1):
            print(f"state_{d}_{link}", _answer(N.nvmlDeviceGetNvLinkState, h, link))
            print(f"cap_{d}_{link}", _answer(N.nvmlDeviceGetNvLinkCapability, h, link, P2P))
            remote = _answer(N.nvmlDeviceGetNvLinkRemotePciInfo, h, link)
            print(f"remote_{d}_{link}", getattr(remote, "busId", remote))
            print(f"version_{d}_{link}", _answer(N.nvmlDeviceGetNvLinkVersion, h, link))
        (c2c,) = N.nvmlDeviceGetFieldValues(h, [N.NVML_FI_DEV_C2C_LINK_COUNT])
        print(f"c2c_{d}", c2c.nvmlReturn)
        peers: dict[int, int] = {}
        for link in range(18):
            if _answer(N.nvmlDeviceGetNvLinkCapability, h, link, P2P) != 1:
                continue
            (state,) = N.nvmlDeviceGetFieldValues(h, [(N.NVML_FI_DEV_NVLINK_GET_STATE, link)])
            if state.nvmlReturn != N.NVML_SUCCESS or state.value.uiVal != N.NVML_FEATURE_ENABLED:
                continue
            pci = N.nvmlPciInfo_t()
            if lib.nvmlDeviceGetNvLinkRemotePciInfo(h, ctypes.c_uint(link), ctypes.byref(pci)) != 0:
                continue
            peer = N.nvmlDeviceGetIndex(N.nvmlDeviceGetHandleByPciBusId(pci.busId.lower()))
            peers[peer] = peers.get(peer, 0) + 1
        print(f"nccl_{d}", ",".join(f"{peer}:{count}" for peer, count in sorted(peers.items())), flush=True)
        for other in range(N.nvmlDeviceGetCount()):  # P2P read status, as NCCL asks it of every pair
            print(
                f"p2p_{d}_{other}",
                _answer(N.nvmlDeviceGetP2PStatus, h, N.nvmlDeviceGetHandleByIndex(other), 0),
            )
    N.nvmlShutdown()


def fill() -> None:
    """A program that takes "all free memory" gets the partition: all of it, and not a byte more."""
    import ctypes

    sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent))
    import remote_client as rc

    rc.check(rc.cu.cuInit(0), "cuInit")
    rc.setup()
    free, total = ctypes.c_uint64(), ctypes.c_uint64()
    rc.check(rc.cu.cuMemGetInfo(ctypes.byref(free), ctypes.byref(total)), "info")
    print("cuda_total", total.value)
    print("cuda_free", free.value)
    print("alloc_all", rc.alloc(free.value)[0])
    print("alloc_more", rc.alloc(1 << 20)[0])
    N.nvmlInit()
    h = N.nvmlDeviceGetHandleByIndex(0)
    deadline = time.monotonic() + 15
    mem = N.nvmlDeviceGetMemoryInfo(h)
    while mem.used < total.value and time.monotonic() < deadline:  # the view is refreshed every second
        time.sleep(0.2)
        mem = N.nvmlDeviceGetMemoryInfo(h)
    print("nvml_total", mem.total)
    print("nvml_used", mem.used)
    print("nvml_free", mem.free, flush=True)


def torch_sizes() -> None:
    """PyTorch's view (the runtime's, from the driver) next to NVML's."""
    import torch

    _free, total = torch.cuda.mem_get_info(0)
    N.nvmlInit()
    print("torch_total", total)
    print("props_total", torch.cuda.get_device_properties(0).total_memory)
    print("nvml_total", N.nvmlDeviceGetMemoryInfo(N.nvmlDeviceGetHandleByIndex(0)).total, flush=True)


if __name__ == "__main__":
    what = sys.argv[1]
    if what == "every":
        every()
    elif what == "slice":
        slice_()
    elif what == "fill":
        fill()
    elif what == "torch":
        torch_sizes()
    elif what == "peers":
        peers()
    elif what == "nvlinks":
        nvlinks()
    elif what == "used_at_once":
        used_at_once(int(sys.argv[2]))
    else:
        cuda(int(sys.argv[2]))
