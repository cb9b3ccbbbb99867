"""gpupool's --local libcuda.so.1 interposer: a --local run's CUDA reports the partition's memory size,
and every other driver call reaches the host's real driver unchanged (docs/remote.md, "Local runs:
one memory size").

The "real" driver here is a stand-in built by the test: a small C library exporting a few driver
entry points that record what they receive. The interposer is compiled from this tree and loaded by
ctypes in a fresh process, as a program loads libcuda.so.1; the end-to-end test runs `gpuattach run
--local` against a server on simulated GPUs with the stand-in on the library path.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
from pool_harness import ServerProc, api, client_env, gpuattach

from virtualize.client import _localgen
from virtualize.client.remote import (
    ENV_PARTITION_BYTES,
    ENV_REAL_LIBCUDA,
    LOCAL_CUDA_MODULE,
    compile_local_cuda,
    host_libcuda,
)

pytestmark = pytest.mark.timeout(120)
GiB = 1 << 30
REAL_TOTAL, REAL_FREE = 80 * GiB, 70 * GiB  # the stand-in GPU: 10 GiB in use by someone
PARTITION = 20 * GiB

# The stand-in driver: device 0 of 80 GiB with 70 free; cuLaunchKernel (11 arguments, 3 of them on
# the stack) records what it got; cuGetProcAddress_v2 answers from its own exports, as the driver does
# (the _v2 version of a name where there is one).
STAND_IN = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
static unsigned long long seen[11];
static const unsigned char table[16] = {16, 0, 0, 0, 0, 0, 0, 0, 7};
int cuInit(unsigned flags) { seen[0] = flags; return flags == 99 ? 101 : 0; }
int cuDeviceTotalMem_v2(size_t *b, int dev) { if (dev) return 101; *b = %(total)dULL; return 0; }
int cuDeviceTotalMem(unsigned *b, int dev) { if (dev) return 101; *b = 0xFFFFFFFFu; return 0; }
int cuMemGetInfo_v2(size_t *f, size_t *t) { *f = %(free)dULL; *t = %(total)dULL; return 0; }
int cuCtxGetDevice(int *dev) { *dev = 0; return 0; }
int cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                   unsigned shmem, void *stream, void **params, void **extra) {
    unsigned long long a[11] = {(unsigned long long)f, gx, gy, gz, bx, by, bz, shmem,
                                (unsigned long long)stream, (unsigned long long)params, (unsigned long long)extra};
    memcpy(seen, a, sizeof a);
    return 719;
}
int cuGetExportTable(const void **out, const void *uuid) { *out = table; return 0; }
int cuGetProcAddress_v2(const char *name, void **pfn, int version, unsigned long long flags, void *status) {
    Dl_info info; dladdr((void *)cuInit, &info);
    void *self = dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD);
    char v2[128];  /* the driver hands out the newest ABI version of a name: cuMemGetInfo -> _v2 */
    snprintf(v2, sizeof v2, "%%s_v2", name);
    *pfn = self ? dlsym(self, v2) : NULL;
    if (self && !*pfn) *pfn = dlsym(self, name);
    return *pfn ? 0 : 500;
}
unsigned long long standInSeen(int i) { return seen[i]; }
const void *standInTable(void) { return table; }
"""

PROBE = r"""
import ctypes, json, sys
lib = ctypes.CDLL("libcuda.so.1")
real = ctypes.CDLL(sys.argv[1])
out = {"interposer": hasattr(lib, "gpupoolLocalCuda")}
size, free = ctypes.c_size_t(), ctypes.c_size_t()
out["init_rc"] = lib.cuInit(7)
out["init_seen"] = real.standInSeen(0)
out["init_err"] = lib.cuInit(99)
lib.cuLaunchKernel.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3
out["launch_rc"] = lib.cuLaunchKernel(0xF00D, 1, 2, 3, 4, 5, 6, 7, 0x5EED, 0xBEEF, 0xCAFE)
real.standInSeen.restype = ctypes.c_ulonglong
out["launch_seen"] = [real.standInSeen(i) for i in range(11)]
out["total_rc"] = lib.cuDeviceTotalMem_v2(ctypes.byref(size), 0)
out["total"] = size.value
lib.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(size))
out["info_free"], out["info_total"] = free.value, size.value
small = ctypes.c_uint()
lib.cuDeviceTotalMem(ctypes.byref(small), 0)
out["total_v1"] = small.value
fn = ctypes.c_void_p()
lib.cuGetProcAddress_v2.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, ctypes.c_ulonglong, ctypes.c_void_p]
lib.cuGetProcAddress_v2(b"cuMemGetInfo", ctypes.byref(fn), 13000, 0, None)
proto = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t))
proto(fn.value)(ctypes.byref(free), ctypes.byref(size))
out["proc_info_total"] = size.value
lib.cuGetProcAddress_v2(b"cuLaunchKernel", ctypes.byref(fn), 13000, 0, None)
out["proc_launch_is_real"] = fn.value == ctypes.cast(real.cuLaunchKernel, ctypes.c_void_p).value
table = ctypes.c_void_p()
lib.cuGetExportTable(ctypes.byref(table), None)
real.standInTable.restype = ctypes.c_void_p
out["table_is_real"] = table.value == real.standInTable()
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def libs(tmp_path_factory) -> tuple[Path, Path]:
    """(directory holding the interposer as libcuda.so.1, the stand-in driver's path)."""
    root = tmp_path_factory.mktemp("localcuda")
    (root / "real").mkdir()
    source = root / "stand_in.c"
    source.write_text(STAND_IN % {"total": REAL_TOTAL, "free": REAL_FREE})
    real = root / "real" / "libcuda.so.1"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(real), str(source), "-ldl"], check=True, timeout=60)
    return compile_local_cuda(root / "interposer").parent, real


def probe(libs, partition: str | None = str(PARTITION), real: Path | None = None) -> tuple[dict, str]:
    directory, stand_in = libs
    env = {
        "PATH": "/usr/bin:/bin",
        "LD_LIBRARY_PATH": str(directory),
        ENV_REAL_LIBCUDA: str(real or stand_in),
    }
    if partition is not None:
        env[ENV_PARTITION_BYTES] = partition
    out = subprocess.run([sys.executable, "-c", PROBE, str(stand_in)], env=env, capture_output=True,
                         text=True, timeout=30)  # fmt: skip
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout), out.stderr


def test_the_forwarding_list_is_current_and_covers_every_driver_name(libs):
    """The interposer exports exactly the names the NVIDIA driver exports, so a library that dlsym()s
    any driver function finds it; the generated forwarding list is current."""
    assert _localgen.main(["--check"]) == 0
    exported = subprocess.run(["nm", "-D", "--defined-only", str(libs[0] / "libcuda.so.1")],
                              capture_output=True, text=True, check=True).stdout  # fmt: skip
    names = {line.split()[-1] for line in exported.splitlines() if " T " in line}
    assert names == set(_localgen.driver_names())


def test_forwarded_calls_reach_the_real_driver_unchanged(libs):
    """Calls the interposer does not answer arrive at the real driver with every argument (eleven for
    cuLaunchKernel, some passed on the stack) and their result comes back as the driver gave it."""
    got, _ = probe(libs)
    assert got["interposer"]
    assert (got["init_rc"], got["init_seen"], got["init_err"]) == (0, 7, 101)
    assert got["launch_rc"] == 719
    assert got["launch_seen"] == [0xF00D, 1, 2, 3, 4, 5, 6, 7, 0x5EED, 0xBEEF, 0xCAFE]
    assert got["proc_launch_is_real"], "cuGetProcAddress must hand out the real function for other names"
    assert got["table_is_real"], "cuGetExportTable must pass the driver's table through untouched"


def test_the_memory_queries_answer_the_partition(libs):
    """cuDeviceTotalMem and cuMemGetInfo (directly and through cuGetProcAddress, the CUDA runtime's
    route) say the partition's size; free is what is left of the partition after everything in use on
    the GPU, and neither is ever more than the GPU has."""
    got, _ = probe(libs)
    in_use = REAL_TOTAL - REAL_FREE
    assert got["total_rc"] == 0 and got["total"] == PARTITION
    assert got["info_total"] == got["proc_info_total"] == PARTITION
    assert got["info_free"] == PARTITION - in_use
    assert got["total_v1"] == 0xFFFFFFFF  # the 32-bit query saturates as the driver's does
    larger, _ = probe(libs, partition=str(REAL_TOTAL + GiB))  # never more than the GPU has
    assert (larger["info_total"], larger["info_free"], larger["total"]) == (REAL_TOTAL, REAL_FREE, REAL_TOTAL)
    crowded, _ = probe(libs, partition=str(5 * GiB))
    assert crowded["info_free"] == 0 and crowded["info_total"] == 5 * GiB


def test_without_a_partition_the_real_numbers_pass_through(libs):
    """A device the lease does not limit keeps the driver's own numbers."""
    got, _ = probe(libs, partition=None)
    assert (got["total"], got["info_total"], got["info_free"]) == (REAL_TOTAL, REAL_TOTAL, REAL_FREE)


def test_pointed_at_itself_it_refuses_instead_of_looping(libs):
    """GPUPOOL_REAL_LIBCUDA naming the interposer (a misconfiguration) gives CUDA errors and one line on
    stderr, never a call that jumps to itself forever."""
    directory = libs[0]
    env = {
        "PATH": "/usr/bin:/bin",
        "LD_LIBRARY_PATH": str(directory),
        ENV_REAL_LIBCUDA: str(directory / "libcuda.so.1"),
    }
    code = "import ctypes; lib = ctypes.CDLL('libcuda.so.1'); print(lib.cuInit(0), lib.cuInit(0))"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and out.stdout.split() == ["3", "3"]  # CUDA_ERROR_NOT_INITIALIZED
    assert "names gpupool's interposer" in out.stderr


def test_the_hosts_driver_is_found_and_never_gpupools_own(libs):
    """gpuattach finds the driver's libcuda.so.1 for the interposer, passing over the interposer itself."""
    directory, stand_in = libs
    found = host_libcuda({"LD_LIBRARY_PATH": f"{directory}:{stand_in.parent}"})
    assert found is not None and found.resolve() != (directory / "libcuda.so.1").resolve()


RUN_PROBE = r"""
import ctypes
lib = ctypes.CDLL("libcuda.so.1")
size = ctypes.c_size_t()
lib.cuDeviceTotalMem_v2(ctypes.byref(size), 0)
print(f"interposer={int(hasattr(lib, 'gpupoolLocalCuda'))}")
print(f"total={size.value}")
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = ServerProc(tmp_path_factory.mktemp("local-pool"), "1xH100-80GB").start()
    yield srv
    srv.stop()


@pytest.mark.skipif(not importlib.util.find_spec(LOCAL_CUDA_MODULE), reason="the interposer is not built")
def test_gpuattach_run_local_puts_the_interposer_first(server, libs, tmp_path):
    """`gpuattach run --local -p 0.25` starts the command with gpupool's interposer as its libcuda.so.1,
    in front of this host's driver: cuDeviceTotalMem says the partition's size."""
    env = client_env(tmp_path, [server.url], server.token("local-cuda"))
    env["LD_LIBRARY_PATH"] = str(libs[1].parent)  # the host's driver, as a GPU host has it
    out = gpuattach("run", "--local", "-n", "1", "-p", "0.25", "--", sys.executable, "-c", RUN_PROBE,
                    env=env, timeout=60)  # fmt: skip
    assert out.returncode == 0, out.stderr
    got = dict(line.split("=", 1) for line in out.stdout.split())
    status, answer = api(server.url, "GET", "/v1/gpus", server.token("local-look"))
    assert status == 200
    assert got["interposer"] == "1"
    assert int(got["total"]) == answer["gpus"][0]["mem_total_bytes"] // 4
