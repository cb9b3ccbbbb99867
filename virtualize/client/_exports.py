"""The driver's private export tables (`cuGetExportTable`) that gpupool's `libcuda.so.1` answers.

The CUDA runtime — libcudart, shared or statically linked into cuBLAS, cuDNN, NCCL and friends —
asks the driver for tables of functions keyed by UUIDs before its first public call. Which tables
and which slots it uses was traced natively (tools/darktrace, DESIGN.md's facts: PyTorch 2.11, CuPy 14,
cuda.core 1.2 ask for the same seven tables). Each slot below is either emulated in the client —
state that belongs to the client process (context-local storage, tool buffers) or an answer the
shim can compute (the primary context of a device, the integrity check) — by the hand-written C
function it names (shim/shim_exports.c), or refused: a slot not listed returns
CUDA_ERROR_NOT_SUPPORTED and says once on stderr which table and slot it was. A table not listed
here is refused with one line naming its UUID.

`python -m virtualize.common._shimgen` writes the tables into shim/exports_gen.h.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass


@dataclass(frozen=True)
class Slot:
    index: int
    function: str  # the C function in shim/shim_exports.c; "" leaves the slot NULL (the runtime checks)
    signature: str  # what the runtime passes, as far as it is known
    why: str


@dataclass(frozen=True)
class ExportTable:
    name: str
    uuid: str  # the 16 bytes the caller passes (a CUuuid), in order, written as a GUID
    words: int  # 8-byte words in the table, the size word included
    slots: tuple[Slot, ...]
    sized: bool = True  # the first word holds the table's size in bytes

    @property
    def key(self) -> bytes:
        return uuid.UUID(self.uuid).bytes

    @property
    def short(self) -> str:
        return self.key.hex()[:8]


def _s(index: int, function: str, signature: str, why: str) -> Slot:
    return Slot(index, function, signature, why)


TABLES: tuple[ExportTable, ...] = (
    ExportTable(
        "cudart_interface",
        "6BD5FB6C-5BF4-E74A-8987-D93912FD9DF9",
        13,
        (
            _s(
                1,
                "gp_x_module_from_fatbin_wrapper",
                "(CUmodule *out, const fatbin_wrapper *w)",
                "loads the fatbin a registered module wraps (older runtimes)",
            ),
            _s(
                2,
                "gp_x_primary_context",
                "(CUcontext *out, CUdevice dev)",
                "the device's primary context, as cudart enumerates devices",
            ),
            _s(
                6,
                "gp_x_module_from_fatbin_wrapper_ext",
                "(CUmodule *out, const fatbin_wrapper *w, void *, void *, u32)",
                "the same with options the shim does not take (they must be empty)",
            ),
            _s(7, "gp_x_nothing", "(size_t)", "a notification with nothing to do in the client"),
            _s(
                8,
                "gp_x_module_from_fatbin_header_ext",
                "(const fatbin_header *h, CUmodule *out, void *, void *, u32)",
                "loads a fatbin given its header",
            ),
            _s(
                12,
                "gp_x_success",
                "(void)",
                "loads the PTX compiler, nvvm and tile IR on a real driver; the worker has them",
            ),
        ),
    ),
    ExportTable(
        "tools_tls",
        "42D85A81-23F6-CB47-8298-F6E78A3AECDC",
        3,
        (
            _s(
                2,
                "gp_x_tools_tls",
                "(void **state, u32 callback_id, const void *params)",
                "opens a tool callback for an API call; no tool is attached in the client",
            ),
        ),
    ),
    ExportTable(
        "tools_runtime_callback_hooks",
        "A094798C-2E74-2E74-93F2-0800200C0A66",
        7,
        (
            _s(
                2,
                "gp_x_hooks_buffer_1",
                "(void **buffer, size_t *size)",
                "a zeroed buffer where tools would install runtime callbacks: none are",
            ),
            _s(6, "gp_x_hooks_buffer_2", "(void **buffer, size_t *size)", "the second such buffer"),
        ),
    ),
    ExportTable(
        "context_local_storage",
        "C693336E-1121-DF11-A8C3-68F355D89593",
        4,
        (
            _s(
                0,
                "gp_x_cls_put",
                "(CUcontext ctx, void *key, void *value, dtor(ctx, key, value))",
                "cudart keeps its per-context state here: a table in the client",
            ),
            _s(1, "gp_x_cls_delete", "(CUcontext ctx, void *key)", "drops an entry"),
            _s(2, "gp_x_cls_get", "(void **value, CUcontext ctx, void *key)", "reads an entry"),
        ),
        sized=False,
    ),
    ExportTable(
        "integrity_check",
        "D4082055-BDE6-704B-8D34-BA123C66E1F2",
        3,
        (
            _s(
                1,
                "gp_x_integrity_check",
                "(u32 runtime_version, u64 unix_seconds, u64 result[2])",
                "the runtime checks that it talks to a driver it trusts: an HMAC-MD2 over this process, "
                "these tables and the devices, which the runtime recomputes and compares",
            ),
        ),
    ),
    ExportTable(
        "context_checks",
        "263E8860-7CD2-6143-92F6-BBD5006DFA7E",
        15,
        (
            _s(
                2,
                "gp_x_context_check",
                "(CUcontext ctx, u32 *flags, const void **extra)",
                "flags of a context that are never set on the contexts a lease has",
            ),
            _s(3, "gp_x_zero", "(void)", "another such check; 0"),
        ),
    ),
    ExportTable(
        "tools_callbacks",
        "21318C60-9714-3248-8CA6-41FF7324C8F2",
        93,
        (
            _s(
                4,
                "gp_x_tools_callback_state",
                "(void *state, u64 *enabled, ...)",
                "whether callbacks are to be made for this state: the driver answers 1 with no tool "
                "attached (measured natively on driver 580 under cuBLASLt's heuristics)",
            ),
            _s(
                39,
                "gp_x_tools_object_value",
                "(void *state, void *object, u64 *value)",
                "a value of the state's object; the driver answers 7 (measured natively, CuPy's matmul)",
            ),
            _s(
                51,
                "gp_x_tools_state_object",
                "(void *state, u64 which, void **object)",
                "the state's object (word 13 of the driver's state), asked for by cuBLAS before some GEMMs",
            ),
        ),
    ),
    # cuBLASLt (bf16/fp16 GEMMs, PyTorch's addmm) asks slot 4 for two driver objects, byte tables that
    # slot 13 then fills (measured natively on driver 580). Declined: cuBLASLt then takes another path,
    # and its results stay bit-equal to native (torch bf16/fp16 matmul, ResNet-50 training, on an H100).
    ExportTable(
        "cublaslt_objects",
        "1734DC26-800D-4745-8726-C0F1E7DD8BCA",
        17,
        (
            _s(
                4,
                "gp_x_declined",
                "(void **object_a, void **object_b)",
                "declined quietly: cuBLASLt falls back to a path with the same results",
            ),
        ),
    ),
    # cuFFT (cufftPlan*, also through CuPy, JAX/XLA and torch.fft) loads each kernel module with
    # cuModuleLoadData and then asks slot 7 for its functions; without the table every plan fails with
    # CUFFT_INTERNAL_ERROR. Traced natively with darktrace's argument log (driver 580, cuFFT 12).
    ExportTable(
        "module_functions",
        "6E163FBE-B958-444D-835C-E182AFF1991E",
        99,
        (
            _s(
                7,
                "gp_x_module_functions",
                "(CUcontext ctx, CUmodule module, void (*each)(void *arg, CUfunction f), void *arg) -> count",
                "calls `each` with every function of the module (cuModuleEnumerateFunctions on the worker)",
            ),
        ),
    ),
    ExportTable(
        "runtime_messages",
        "F8CFF951-2146-8B4E-B9E2-FB469E7C0DD9",
        3,
        (
            _s(
                1,
                "gp_x_runtime_message",
                "(const char *source, u64 level, const char *format, va_list args)",
                "the runtime's warnings (e.g. two kernels of one name); the driver keeps them to itself: "
                "printed only under GPUPOOL_SHIM_TRACE",
            ),
        ),
    ),
)

BY_KEY: dict[bytes, ExportTable] = {table.key: table for table in TABLES}
