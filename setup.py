"""Builds gpupool's libcuda.so.1 (the remote-execution shim), its libnvidia-ml.so.1 (NVML), libgpupool_nccl.so
(NCCL at its API) and the --local libcuda.so.1 interposer with the package; everything else is in pyproject.toml.

The shim is plain C with no CUDA headers and no Python API: it is compiled as an extension module
only so that `pip install .` and `pip install -e .` build it wherever a C compiler exists;
`virtualize.client.remote` links it into a directory as `libcuda.so.1`.
"""

from glob import glob

from setuptools import Extension, setup


def plain_c(module: str, sources: list[str], depends: list[str], soname: str = "") -> Extension:
    """A library of plain C built as an extension module (no Python API; loaded by path or ctypes).
    optional: without a C compiler the install goes on, and what needs the library says it is not built."""
    link = ["-pthread", *([f"-Wl,-soname,{soname}"] if soname else []), "-ldl"]
    return Extension(module, sources=sources, depends=depends, py_limited_api=False, optional=True,
                     extra_compile_args=["-O2", "-fvisibility=hidden", "-pthread", "-std=gnu11"],
                     extra_link_args=link)  # fmt: skip


setup(
    ext_modules=[
        # every C file of the shim's folder (virtualize/client/remote.py's compile_shim takes the same)
        plain_c(
            "virtualize.client._libcuda_shim",
            sorted(glob("virtualize/client/shim/*.c")),
            [
                "virtualize/client/shim/shim.h",
                "virtualize/client/shim/shim_calls.h",
                "virtualize/client/shim/calls_gen.h",
                "virtualize/client/shim/calls_gen_types.h",
                "virtualize/client/shim/exports_gen.h",
                "virtualize/common/include/gp_ranges.h",
                "virtualize/common/include/gp_ring.h",
            ],
            soname="libcuda.so.1",
        ),
        # gpupool's libnvidia-ml.so.1: NVML answered from the lease (virtualize/client/_nvml_view.py), for
        # nvidia-smi, pynvml, nvitop and gpustat inside `gpuattach run`. Plain C, no NVML headers.
        plain_c(
            "virtualize.client._libnvml_shim",
            ["virtualize/client/nvml/nvml_shim.c"],
            ["virtualize/client/nvml/nvml_stubs_gen.h"],
            soname="libnvidia-ml.so.1",
        ),
        # libgpupool_nccl.so: NCCL forwarded at its API to the lease's worker (virtualize/client/nccl/nccl_forward.c),
        # preloaded by `gpuattach run --spread`. Plain C, no NCCL headers.
        plain_c(
            "virtualize.client._libgpupool_nccl",
            ["virtualize/client/nccl/nccl_forward.c"],
            [
                "virtualize/client/nccl/nccl_stubs_gen.h",
                "virtualize/client/shim/shim.h",
                "virtualize/client/shim/calls_gen_types.h",
            ],
            soname="libgpupool_nccl.so",
        ),
        # The --local interposer (virtualize/client/localcuda/local_cuda.c): the host's real libcuda.so.1 with
        # the lease's memory size. Plain C, no CUDA headers.
        plain_c(
            "virtualize.client._liblocalcuda",
            ["virtualize/client/localcuda/local_cuda.c"],
            ["virtualize/client/localcuda/forward_gen.h"],
            soname="libcuda.so.1",
        ),
        # The worker's native hot path and its TLS stream (virtualize/server/_native_dispatch.py and
        # _native_tls.py load it with ctypes; no Python API either). Without it the worker serves
        # every call, and runs TLS, in Python.
        plain_c(
            "virtualize.server._dispatch",
            ["virtualize/server/native/dispatch.c", "virtualize/server/native/tls.c"],
            [
                "virtualize/server/native/native.h",
                "virtualize/server/native/dispatch_gen.h",
                "virtualize/common/include/gp_ranges.h",
                "virtualize/common/include/gp_ring.h",
            ],
        ),
    ]
)
