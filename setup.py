"""Builds gpupool's libcuda.so.1 (the remote-execution shim), its libnvidia-ml.so.1 (NVML) and the --local
libcuda.so.1 interposer with the package; everything else is in pyproject.toml.

The shim is plain C with no CUDA headers and no Python API: it is compiled as an extension module
only so that `pip install .` and `pip install -e .` build it wherever a C compiler exists;
`virtualize.remote` links it into a directory as `libcuda.so.1`.
"""

from glob import glob

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "virtualize._libcuda_shim",
            # every C file of the shim's folder (virtualize/remote.py's compile_shim takes the same)
            sources=sorted(glob("virtualize/shim/*.c")),
            depends=[
                "virtualize/shim/shim.h",
                "virtualize/shim/shim_calls.h",
                "virtualize/shim/calls_gen.h",
                "virtualize/shim/calls_gen_types.h",
                "virtualize/shim/exports_gen.h",
                "virtualize/include/gp_ranges.h",
            ],
            extra_compile_args=["-O2", "-fvisibility=hidden", "-pthread", "-std=gnu11"],
            extra_link_args=["-pthread", "-Wl,-soname,libcuda.so.1", "-ldl"],
            py_limited_api=False,
            # Without a C compiler the install goes on; remote runs then say the shim is not built.
            optional=True,
        ),
        # gpupool's libnvidia-ml.so.1: NVML answered from the lease (virtualize/_nvml_view.py), for
        # nvidia-smi, pynvml, nvitop and gpustat inside `gpuattach run`. Plain C, no NVML headers.
        Extension(
            "virtualize._libnvml_shim",
            sources=["virtualize/nvml/nvml_shim.c"],
            depends=["virtualize/nvml/nvml_stubs_gen.h"],
            extra_compile_args=["-O2", "-fvisibility=hidden", "-pthread", "-std=gnu11"],
            extra_link_args=["-pthread", "-Wl,-soname,libnvidia-ml.so.1", "-ldl"],
            py_limited_api=False,
            optional=True,
        ),
        # The --local interposer (virtualize/localcuda/local_cuda.c): the host's real libcuda.so.1 with
        # the lease's memory size. Plain C, no CUDA headers.
        Extension(
            "virtualize._liblocalcuda",
            sources=["virtualize/localcuda/local_cuda.c"],
            depends=["virtualize/localcuda/forward_gen.h"],
            extra_compile_args=["-O2", "-fvisibility=hidden", "-pthread", "-std=gnu11"],
            extra_link_args=["-pthread", "-Wl,-soname,libcuda.so.1", "-ldl"],
            py_limited_api=False,
            optional=True,
        ),
        # The worker's native hot path and its TLS stream (virtualize/_native_dispatch.py and
        # _native_tls.py load it with ctypes; no Python API either). Without it the worker serves
        # every call, and runs TLS, in Python.
        Extension(
            "virtualize._dispatch",
            sources=["virtualize/native/dispatch.c", "virtualize/native/tls.c"],
            depends=[
                "virtualize/native/native.h",
                "virtualize/native/dispatch_gen.h",
                "virtualize/include/gp_ranges.h",
            ],
            extra_compile_args=["-O2", "-fvisibility=hidden", "-pthread", "-std=gnu11"],
            extra_link_args=["-pthread", "-ldl"],
            py_limited_api=False,
            optional=True,
        ),
    ]
)
