"""Builds gpupool's libcuda.so.1 (the remote-execution shim), its libnvidia-ml.so.1 (NVML), libgpupool_nccl.so
(NCCL at its API) and the --local libcuda.so.1 interposer with the package; everything else is in pyproject.toml.

The shim is plain C with no CUDA headers and no Python API: it is compiled as an extension module
only so that `pip install .` and `pip install -e .` build it wherever a C compiler exists;
`virtualize.client.remote` links it into a directory as `libcuda.so.1`.
"""

from glob import glob

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "virtualize.client._libcuda_shim",
            # every C file of the shim's folder (virtualize/client/remote.py's compile_shim takes the same)
            sources=sorted(glob("virtualize/client/shim/*.c")),
            depends=[
                "virtualize/client/shim/shim.h",
                "virtualize/client/shim/shim_calls.h",
                "virtualize/client/shim/calls_gen.h",
                "virtualize/client/shim/calls_gen_types.h",
                "virtualize/client/shim/exports_gen.h",
                "virtualize/common/include/gp_ranges.h",
            ],
            extra_compile_args=["-O2", "-fvisibility=hidden", "-pthread", "-std=gnu11"],
            extra_link_args=["-pthread", "-Wl,-soname,libcuda.so.1", "-ldl"],
            py_limited_api=False,
            # Without a C compiler the install goes on; remote runs then say the shim is not built.
            optional=True,
        ),
        # gpupool's libnvidia-ml.so.1: NVML answered from the lease (virtualize/client/_nvml_view.py), for
        # nvidia-smi, pynvml, nvitop and gpustat inside `gpuattach run`. Plain C, no NVML headers.
        Extension(
            "virtualize.client._libnvml_shim",
            sources=["virtualize/client/nvml/nvml_shim.c"],
            depends=["virtualize/client/nvml/nvml_stubs_gen.h"],
            extra_compile_args=["-O2", "-fvisibility=hidden", "-pthread", "-std=gnu11"],
            extra_link_args=["-pthread", "-Wl,-soname,libnvidia-ml.so.1", "-ldl"],
            py_limited_api=False,
            optional=True,
        ),
        # libgpupool_nccl.so: NCCL forwarded at its API to the lease's worker (virtualize/client/nccl/nccl_forward.c),
        # preloaded by `gpuattach run --spread`. Plain C, no NCCL headers.
        Extension(
            "virtualize.client._libgpupool_nccl",
            sources=["virtualize/client/nccl/nccl_forward.c"],
            depends=[
                "virtualize/client/nccl/nccl_stubs_gen.h",
                "virtualize/client/shim/shim.h",
                "virtualize/client/shim/calls_gen_types.h",
            ],
            extra_compile_args=["-O2", "-fvisibility=hidden", "-pthread", "-std=gnu11"],
            extra_link_args=["-pthread", "-Wl,-soname,libgpupool_nccl.so", "-ldl"],
            py_limited_api=False,
            optional=True,
        ),
        # The --local interposer (virtualize/client/localcuda/local_cuda.c): the host's real libcuda.so.1 with
        # the lease's memory size. Plain C, no CUDA headers.
        Extension(
            "virtualize.client._liblocalcuda",
            sources=["virtualize/client/localcuda/local_cuda.c"],
            depends=["virtualize/client/localcuda/forward_gen.h"],
            extra_compile_args=["-O2", "-fvisibility=hidden", "-pthread", "-std=gnu11"],
            extra_link_args=["-pthread", "-Wl,-soname,libcuda.so.1", "-ldl"],
            py_limited_api=False,
            optional=True,
        ),
        # The worker's native hot path and its TLS stream (virtualize/server/_native_dispatch.py and
        # _native_tls.py load it with ctypes; no Python API either). Without it the worker serves
        # every call, and runs TLS, in Python.
        Extension(
            "virtualize.server._dispatch",
            sources=["virtualize/server/native/dispatch.c", "virtualize/server/native/tls.c"],
            depends=[
                "virtualize/server/native/native.h",
                "virtualize/server/native/dispatch_gen.h",
                "virtualize/common/include/gp_ranges.h",
            ],
            extra_compile_args=["-O2", "-fvisibility=hidden", "-pthread", "-std=gnu11"],
            extra_link_args=["-pthread", "-ldl"],
            py_limited_api=False,
            optional=True,
        ),
    ]
)
