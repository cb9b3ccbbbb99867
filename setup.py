"""Builds gpupool's libcuda.so.1 (the remote-execution shim) and libnvidia-ml.so.1 (its NVML) with the
package; everything else is in pyproject.toml.

The shim is plain C with no CUDA headers and no Python API: it is compiled as an extension module
only so that `pip install .` and `pip install -e .` build it wherever a C compiler exists;
`virtualize.remote` links it into a directory as `libcuda.so.1`.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "virtualize._libcuda_shim",
            sources=[
                "virtualize/shim/shim.c",
                "virtualize/shim/shim_calls.c",
                "virtualize/shim/shim_exports.c",
                "virtualize/shim/shim_memo.c",
                "virtualize/shim/shim_auth.c",
                "virtualize/shim/shim_managed.c",
                "virtualize/shim/shim_pools.c",
            ],
            depends=[
                "virtualize/shim/shim.h",
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
