"""Generate the shim's C from the call table: `python -m virtualize.common._shimgen` (writes shim/calls_gen.h),
the worker's native loop's frame layout and guard rules (native/dispatch_gen.h), and the driver census
(docs/driver-census.md, its summary in docs/remote.md: virtualize/common/_census.py).

The output is committed, so building the shim needs only a C compiler; tests/test_shim_build.py and
tests/test_driver_census.py fail when it is stale.
"""

from __future__ import annotations

import re
import struct
import sys
from pathlib import Path

from virtualize.client._exports import TABLES
from virtualize.common import _census, _wire
from virtualize.common._calls import (
    ALIASES,
    CALL_IDS,
    CALLS,
    EVENT_LAUNCH_ATTRIBUTES,
    FORWARDED_LAUNCH_ATTRIBUTES,
    HANDLE_TYPES,
    LEGACY_ABIS,
    LEGACY_OWN_ANSWERS,
    MEMO_GROUPS,
    NCCL_COLLECTIVES,
    NCCL_CONFIG_INTS,
    POINTER_ATTRIBUTE_SIZES,
    POOL_INT_ATTRIBUTES,
    SUBJECT_TYPES,
    UNFORWARDED_ABIS,
    WIRE_VERSION,
    Call,
    Mode,
    Param,
)
from virtualize.common._results import RESULT_TEXT, RESULTS
from virtualize.common.errors import VirtualizeError
from virtualize.server import _guard_rules

SHIM_DIR = Path(__file__).parent.parent / "client" / "shim"
TYPES_OUTPUT = SHIM_DIR / "calls_gen_types.h"  # ids, wire structs, prototypes (every C file)
BODIES_OUTPUT = SHIM_DIR / "calls_gen.h"  # plain call bodies and lookup tables (shim_calls.c only)
EXPORTS_OUTPUT = SHIM_DIR / "exports_gen.h"  # the private export tables (shim_exports.c only)
NCCL_DIR = SHIM_DIR.parent / "nccl"  # libgpupool_nccl.so: NCCL at its API
NCCL_STUBS_OUTPUT = NCCL_DIR / "nccl_stubs_gen.h"  # every NCCL name nccl_forward.c does not forward
DRIVER_SYMBOLS = SHIM_DIR / "driver_symbols.txt"  # every name the real libcuda.so.1 exports
NATIVE_OUTPUT = (
    Path(__file__).parent.parent / "server" / "native" / "dispatch_gen.h"
)  # the worker's native loop (dispatch.c)

C_TYPES = {"i32": "int32_t", "u32": "uint32_t", "u64": "uint64_t", "u8": "uint8_t", "u16": "uint16_t"}
C_TYPES.update({"f32": "float", "dptr": "uint64_t", "ipc": "struct gp_ipc_handle"})  # ipc: 64 bytes, by value


def key(call: Call) -> str:
    return call.name if call.symbol == "-" else call.symbol


def c_type(param: Param) -> str:
    if param.type in ("cstr",):
        return "const char *"
    if param.type in ("ptr", "bytes"):
        return "void *"
    if param.type == "buf":
        return "char *"
    if param.type == "b16":
        return "void *"
    base = C_TYPES.get(param.type, "uint64_t")  # handles are pointer-sized
    return f"{base} *" if param.out else f"{base} "


def prototype(call: Call) -> str:
    params = ", ".join(f"{c_type(p)}{p.name}" for p in call.params) or "void"
    return f"CUresult {call.symbol}({params})"


def wire_structs(call: Call) -> list[str]:
    lines = []
    for kind, params in (("in", call.ins), ("out", [p for p in call.outs if p.struct_code])):
        if not params:
            continue
        fields = " ".join(f"{C_TYPES.get(p.type, 'uint64_t')} {p.name};" for p in params)
        lines.append(f"struct gp_{kind}_{key(call)} {{ {fields} }} __attribute__((packed));")
    return lines


def c_string(data: bytes) -> str:
    return '"' + "".join(chr(b) if 32 <= b < 127 and b not in b'"\\' else f"\\{b:03o}" for b in data) + '"'


def memo_mask(groups) -> str:
    names = list(MEMO_GROUPS)
    return f"0x{sum(1 << names.index(g) for g in groups):02x}"


def body(call: Call) -> list[str]:
    ins = call.ins
    fixed_outs = [p for p in call.outs if p.struct_code]
    buf_outs = [p for p in call.outs if not p.struct_code]
    bulk_in = [p for p in call.params if p.type == "cstr"]
    lines = [f"GP_EXPORT {prototype(call)} {{", f'    GP_TRACE("{call.symbol}");']
    for p in call.outs:
        if not p.optional:
            lines.append(f"    if (!{p.name}) return CUDA_ERROR_INVALID_VALUE;")
    for p in bulk_in:
        lines.append(f"    if (!{p.name}) return CUDA_ERROR_INVALID_VALUE;")
    # Page-locked memory is the device's at its own address: mapped before GPU work (the queued calls:
    # copies, memsets) uses it.
    for p in ins if call.mode is Mode.ASYNC else ():
        if p.type == "dptr":
            lines.append(f"    gp_pinned_touch({p.name});")
    if ins:
        inits = ", ".join(f".{p.name} = {p.name}" for p in ins)
        lines.append(f"    struct gp_in_{key(call)} in = {{ {inits} }};")
    if fixed_outs:
        lines.append(f"    struct gp_out_{key(call)} out;")
    in_args = "&in, sizeof in" if ins else "NULL, 0"
    out_args = "&out, sizeof out" if fixed_outs else "NULL, 0"
    bulk_args = f"{bulk_in[0].name}, strlen({bulk_in[0].name}) + 1" if bulk_in else "NULL, 0"
    if buf_outs:
        (p,) = buf_outs
        length = "16" if p.type == "b16" else f"(uint64_t)({p.length_from} > 0 ? {p.length_from} : 0)"
        bulk_out = f"{p.name}, {length}"
    else:
        bulk_out = "NULL, 0"
    flags = "GP_FLAG_WANTS_REPLY" if call.mode is Mode.REPLY else "0"
    send = f"gp_call(GP_CALL_{key(call)}, {flags}, {in_args}, {bulk_args}, {out_args}, {bulk_out})"
    forget = ""
    if call.forgets:
        assert call.subject, (
            f"{call.name}: a call that forgets answers needs a function, kernel, module or library"
        )
        attrib = "attrib" if any(p.name == "attrib" for p in call.ins) else "-1"  # -1: may change any
        forget = f"gp_memo_forget(GP_MEMO_{call.forgets}, {call.subject.name}, GP_HANDLE_{call.subject.type}, {attrib});"
    if call.memo:
        assert call.mode is Mode.REPLY and not bulk_in and not buf_outs, (
            f"{call.name}: only plain calls keep answers"
        )
        memo = f"GP_CALL_{key(call)}, GP_MEMO_{call.memo}, {int(call.memo_ctx)}"
        memo_out = "&out, sizeof out" if fixed_outs else "NULL, 0"
        subject = call.subject.name if call.subject else "0"
        lines.append(f"    uint64_t epoch = gp_memo_epoch(GP_MEMO_{call.memo});")
        lines.append("    CUresult r = CUDA_SUCCESS;")
        lines.append(f"    int kept = gp_memo_get({memo}, {in_args}, {memo_out}, &r);")
        lines.append("    if (!kept) {")
        if forget:  # a setter: what it changes goes before and after, then its own success is kept
            lines += [f"        {forget}", f"        r = {send};", f"        {forget}"]
            lines.append(f"        epoch = gp_memo_epoch(GP_MEMO_{call.memo});")
        else:
            lines.append(f"        r = {send};")
        record = (
            "attrib" if forget and any(p.name == "attrib" for p in call.ins) else "-1"
        )  # a setter's record
        lines.append(f"        gp_memo_put({memo}, epoch, {subject}, {record}, r, {in_args}, {memo_out});")
        lines.append("    }")
    elif forget:
        lines += [f"    {forget}", f"    CUresult r = {send};", f"    {forget}"]
    else:
        lines.append(f"    CUresult r = {send};")
    if call.links:
        child = next(p for p in fixed_outs if p.type in SUBJECT_TYPES)
        assert call.subject, f"{call.name}: a call that links handles needs the handle it came from"
        guard = "!kept && " if call.memo else ""
        lines.append(
            f"    if ({guard}r == CUDA_SUCCESS) gp_memo_link(out.{child.name}, {call.subject.name},"
            f" GP_HANDLE_{call.subject.type});"
        )
    if fixed_outs:
        lines.append("    if (r == CUDA_SUCCESS) {")
        for p in fixed_outs:
            cast = f"({C_TYPES.get(p.type, 'uint64_t')})"
            guard = f"if ({p.name}) " if p.optional else ""
            lines.append(f"        {guard}*{p.name} = {cast}out.{p.name};")
        lines.append("    }")
    lines.append("    return r;")
    lines.append("}")
    return lines


HEADER = "/* Generated by `python -m virtualize.common._shimgen` from virtualize/common/_calls.py and _wire.py. Do not edit. */"


def generate_types() -> str:
    out = [
        HEADER,
        "#pragma once",
        "",
        f"#define GP_PROTOCOL_VERSION {WIRE_VERSION}u",
        f"#define GP_FLAG_WANTS_REPLY {_wire.FLAG_WANTS_REPLY}u",
        f"#define GP_CHUNK_BYTES {_wire.CHUNK_BYTES}ull",
        f"#define GP_LAUNCH_ATTRIBUTE_BYTES {_wire.LAUNCH_ATTRIBUTE_BYTES}",
        f"#define GP_MAX_EVENT_PAIRS {_wire.MAX_EVENT_PAIRS}u",
        f'#define GP_ENV_WORKER "{_wire.ENV_WORKER}"',
        f'#define GP_ENV_SECRET "{_wire.ENV_SECRET}"',
        f'#define GP_ENV_LEASE "{_wire.ENV_LEASE}"',
        f'#define GP_ENV_TLS "{_wire.ENV_TLS}"',
        f'#define GP_ENV_ENCRYPT "{_wire.ENV_ENCRYPT}"',
        f'#define GP_ENV_LOCAL "{_wire.ENV_LOCAL}"',
        f'#define GP_ENV_LACKS "{_wire.ENV_LACKS}"',
        f'#define GP_ENV_WORKER_FILE "{_wire.ENV_WORKER_FILE}"',
        f'#define GP_ENV_TRACE "{_wire.ENV_TRACE}"',
        f'#define GP_ENV_PROFILE "{_wire.ENV_PROFILE}"',
        f'#define GP_ENV_MEMO "{_wire.ENV_MEMO}"',
        f'#define GP_ENV_RANKS "{_wire.ENV_RANKS}"',
        f"#define GP_NONCE_BYTES {_wire.NONCE_BYTES}u",
        f"#define GP_KERNEL_OUTPUT ({_wire.KERNEL_OUTPUT})",
        f"#define GP_COPY_DATA ({_wire.COPY_DATA})",
        f"#define GP_COPIES_SENT ({_wire.COPIES_SENT})",
        f"#define GP_COPY_PIECE ({_wire.COPY_PIECE})",
        f"#define GP_EVENT_NAME_TAG 0x{_wire.EVENT_NAME_TAG:x}ull",
        f"#define GP_RECAPTURE_CALL ({_wire.RECAPTURE_CALL})",
        f"#define GP_NODE_PARAMS_BYTES {_wire.NODE_PARAMS_BYTES}u",
        f"#define GP_MOVED ({_wire.MOVED})",
        f"#define GP_MOVED_TO_BYTES {_wire.MOVED_TO.size}u",
        f"#define GP_PROOF_BYTES {_wire.PROOF_BYTES}u",
        f"#define GP_WORKER_LABEL {c_string(_wire.WORKER_LABEL)}",
        f"#define GP_CLIENT_LABEL {c_string(_wire.CLIENT_LABEL)}",
        "",
        "/* Request: call id, flags, args_len, reserved, bulk_len. Reply: result, outs_len, bulk_len. */",
        "struct gp_request { uint32_t call; uint32_t flags; uint32_t args_len; uint32_t reserved; uint64_t bulk_len; }"
        " __attribute__((packed));",
        "struct gp_reply { int32_t result; uint32_t outs_len; uint64_t bulk_len; } __attribute__((packed));",
        f'_Static_assert(sizeof(struct gp_request) == {_wire.REQUEST.size}, "request header");',
        f'_Static_assert(sizeof(struct gp_reply) == {_wire.REPLY.size}, "reply header");',
        "/* An asynchronous copy's frame on the callback connection: its id and result (_wire.COPY_HEAD). */",
        "struct gp_copy_head { uint64_t id; int32_t result; uint32_t reserved; } __attribute__((packed));",
        f'_Static_assert(sizeof(struct gp_copy_head) == {_wire.COPY_HEAD.size}, "copy head");',
        "/* A piece of a large asynchronous copy: its id, offset, the copy's bytes, the frames sent before the copy"
        " (_wire.COPY_PIECE_HEAD). */",
        "struct gp_copy_piece_head { uint64_t id, offset, count, before; } __attribute__((packed));",
        f'_Static_assert(sizeof(struct gp_copy_piece_head) == {_wire.COPY_PIECE_HEAD.size}, "copy piece head");',
        "/* A recapture's question on the callback connection, each node's side, the answer (_wire.RECAPTURE_*). */",
        "struct gp_recapture_head { uint64_t id, node; int32_t status; uint32_t reserved; } __attribute__((packed));",
        "struct gp_recapture_side { unsigned char params[GP_NODE_PARAMS_BYTES]; uint32_t n_args, args_bytes; }"
        " __attribute__((packed));",
        "struct gp_recapture_answer { uint64_t id; int32_t result; uint32_t reserved; } __attribute__((packed));",
        f'_Static_assert(sizeof(struct gp_recapture_head) == {_wire.RECAPTURE_HEAD.size}, "recapture head");',
        f'_Static_assert(sizeof(struct gp_recapture_side) == {_wire.RECAPTURE_SIDE.size}, "recapture side");',
        f'_Static_assert(sizeof(struct gp_recapture_answer) == {_wire.RECAPTURE_ANSWER.size}, "recapture answer");',
        "/* gpEventElapsedMany: a (start, end) pair of its request, an answer of its reply (_wire.EVENT_PAIR,"
        " EVENT_ELAPSED). */",
        "struct gp_event_pair { uint64_t start, end; } __attribute__((packed));",
        "struct gp_event_elapsed { int32_t result; float ms; } __attribute__((packed));",
        f'_Static_assert(sizeof(struct gp_event_pair) == {_wire.EVENT_PAIR.size}, "event pair");',
        f'_Static_assert(sizeof(struct gp_event_elapsed) == {_wire.EVENT_ELAPSED.size}, "elapsed answer");',
        "",
    ]
    for name, value in RESULTS.items():
        out.append(f"#define {name} {value}")
    out.append("")
    out.append("/* gpNcclCollective's kinds (NCCL_COLLECTIVES). */")
    out.extend(f"#define GP_NCCL_{name} {kind}" for kind, name in enumerate(NCCL_COLLECTIVES))
    out.append("/* The config's ints in their order on the wire (NCCL_CONFIG_INTS), X(field) each. */")
    out.append("#define GP_NCCL_CONFIG_INTS(X) " + " ".join(f"X({name})" for name in NCCL_CONFIG_INTS))
    out.append("")
    for call in CALLS:
        out.append(f"#define GP_CALL_{key(call)} {CALL_IDS[call]}")
    out.append(f"#define GP_N_CALLS {len(CALLS)}u")
    out.append("")
    out.append(
        "/* Answers kept in the client (shim_memo.c): the groups, and per call the groups it changes. */"
    )
    for index, group in enumerate(MEMO_GROUPS):
        out.append(f"#define GP_MEMO_{group} {index}")
    out.append(f"#define GP_N_MEMO_GROUPS {len(MEMO_GROUPS)}u")
    for call in CALLS:  # shim_memo.c reads the stream whose capture begins or ends as the first argument
        assert not (call.pauses or call.resumes) or (call.ins and call.ins[0].type == "stream"), (
            f"{call.name}: a call that pauses or resumes kept answers names its stream first"
        )
    for table, groups_of in (
        ("invalidates", lambda c: c.invalidates),
        ("pauses", lambda c: (c.pauses,) if c.pauses else ()),
        ("resumes", lambda c: (c.resumes,) if c.resumes else ()),
    ):
        masks = ", ".join(f"[{CALL_IDS[c]}] = {memo_mask(groups_of(c))}" for c in CALLS if groups_of(c))
        out.append(f"static const uint8_t gp_call_{table}[GP_N_CALLS] __attribute__((unused)) = {{{masks}}};")
    # answers and attribute setters (shim_idle.c: they leave no work on any stream)
    kept = ", ".join(f"[{CALL_IDS[c]}] = 1" for c in CALLS if c.memo)
    out.append(f"static const uint8_t gp_call_keeps_answer[GP_N_CALLS] __attribute__((unused)) = {{{kept}}};")
    names = ", ".join(f'"{key(call)}"' for call in CALLS)
    out.append(f"static const char *const gp_call_names[GP_N_CALLS] __attribute__((unused)) = {{{names}}};")
    out.append("")
    for call in CALLS:
        out.extend(wire_structs(call))
    out.append("")
    # used by several files of hand-written calls, so here rather than in calls_gen.h
    ints = " || ".join(f"(a) == {a}" for a in POOL_INT_ATTRIBUTES)
    out.append(f"#define GP_POOL_ATTRIBUTE_IS_INT(a) ({ints})")
    out.append(
        f"#define GP_FORWARDED_LAUNCH_ATTRIBUTES {launch_attribute_mask()} /* bit i: CUlaunchAttributeID i */"
    )
    out.append("")
    out.append(
        "/* Every exported call (custom ones are hand-written in shim_calls.c and the files beside it). */"
    )
    for call in CALLS:
        if call.symbol != "-":
            out.append(f"GP_EXPORT {prototype(call)};")
    return "\n".join(out) + "\n"


def generate_bodies() -> str:
    out = [HEADER, "#pragma once", ""]
    for call in CALLS:
        if not call.custom and call.symbol != "-":
            out.extend(body(call))
            out.append("")
    out.append(
        "/* Per-thread default-stream variants (_ptsz, _ptds) of forwarded calls: the worker runs each"
    )
    out.append(" * connection's calls in order, so they behave as the calls themselves (docs/remote.md). */")
    by_symbol = {c.symbol: c for c in CALLS if c.symbol != "-"}
    for name, base in per_thread_variants():
        call = by_symbol[base]
        args = ", ".join(p.name for p in call.params)
        out.append(
            f"GP_EXPORT {prototype(call).replace(base + '(', name + '(', 1)} {{ return {base}({args}); }}"
        )
    out.append("")
    out.append(
        "/* Old ABIs with the parameters of a forwarded one (LEGACY_ABIS): that one, under their name. */"
    )
    legacy = dict(LEGACY_ABIS)
    for name, target in LEGACY_ABIS:
        call = by_symbol[target]
        args = ", ".join(p.name for p in call.params)
        own = prototype(call).replace(target + "(", name + "(", 1)
        if name in LEGACY_OWN_ANSWERS:  # the shim's own function (shim_calls.c), for the proc table
            out.append(f"GP_EXPORT {own};")
        else:
            out.append(f"GP_EXPORT {own} {{ return {target}({args}); }}")
    out.append("")
    out.append("/* Every other name the real driver exports: found by dlsym, refused when called. */")
    variants = {name for name, _ in per_thread_variants()}
    for name in unforwarded_symbols():
        if name not in variants and name not in legacy:
            out.append(f'GP_EXPORT CUresult {name}(void) {{ return gp_unforwarded("{name}"); }}')
    out.append("")
    out.append(
        "/* Why a call that is not forwarded is not: the census's groups (virtualize/common/_census.py), each name"
    )
    out.append(
        " * or family ('*': every name it starts) with its group's title and verdict, said when it is called. */"
    )
    out.append("static const struct gp_refusal { const char *name, *why; } gp_refusals[] = {")
    for group in _census.GROUPS:
        if group.verdict in (_census.Verdict.REFUSED, _census.Verdict.NOT_YET):
            for name in group.names:
                out.append(f'    {{"{name}", "{group.title}: {group.verdict.value}"}},')
    out.append("};")
    out.append("")
    out.append(
        "/* What cuGetProcAddress hands out: (name, ABI version) -> function, sorted by name then version."
    )
    out.append(" * An entry with no function is an ABI that is not forwarded: its symbol's refusal. */")
    out.append("static const struct gp_proc gp_procs[] = {")
    procs = [(c.name, c.since, f"(void *){c.symbol}, NULL") for c in CALLS if c.symbol != "-"]
    procs += [(name, since, f"(void *){symbol}, NULL") for name, since, symbol in ALIASES]
    procs += [(name, since, f'NULL, "{symbol}"') for name, since, symbol in UNFORWARDED_ABIS]
    # A name whose oldest ABI in the table is a versioned symbol (cuGraphAddKernelNode_v2) had an older ABI
    # the table does not forward: asked at an older version it is found, and refuses as that ABI. A name
    # whose oldest ABI is its own symbol did not exist before it: not found there, as the driver answers.
    oldest = {}
    for call in sorted((c for c in CALLS if c.symbol != "-"), key=lambda c: -c.since):
        oldest[call.name] = call
    # ... unless cuda.h gives that old ABI the parameters of a forwarded one (LEGACY_ABIS): then it is that.
    procs += [
        (name, 0, f'NULL, "{name}"' if name not in legacy else f"(void *){name}, NULL")
        for name, call in oldest.items()
        if call.symbol != name
    ]
    for name, since, target in sorted(procs):
        out.append(f'    {{"{name}", {since}, {target}}},')
    out.append("};")
    out.append("")
    out.append("static const struct gp_result_text gp_result_texts[] = {")
    names = {value: name for name, value in RESULTS.items()}
    for value, text in RESULT_TEXT.items():
        out.append(f'    {{{value}, "{names[value]}", "{text}"}},')
    out.append("};")
    out.append("")
    sizes = ", ".join(f"[{a}] = {s}" for a, s in POINTER_ATTRIBUTE_SIZES.items())
    out.append(f"static const unsigned char gp_pointer_attribute_size[32] = {{ {sizes} }};")
    return "\n".join(out) + "\n"


def launch_attribute_mask(ids: frozenset[int] | None = None) -> str:
    """FORWARDED_LAUNCH_ATTRIBUTES (or `ids`) as a C mask: bit i for CUlaunchAttributeID i."""
    return f"0x{sum(1 << a for a in (FORWARDED_LAUNCH_ATTRIBUTES if ids is None else ids)):x}ull"


def per_thread_variants() -> list[tuple[str, str]]:
    """(variant, forwarded symbol) for each _ptsz / _ptds name the driver exports."""
    exported = {call.symbol for call in CALLS}
    pairs = []
    for name in unforwarded_symbols():
        base = name.removesuffix("_ptsz").removesuffix("_ptds")
        if base != name and base in exported:
            pairs.append((name, base))
    return pairs


def unforwarded_symbols() -> list[str]:
    exported = {call.symbol for call in CALLS} | {"cuGetProcAddress", "cuGetProcAddress_v2"}
    names = (line.strip() for line in DRIVER_SYMBOLS.read_text().splitlines())
    return sorted({n for n in names if n and not n.startswith("#") and n not in exported})


def generate_exports() -> str:
    """Each export table as an array of words: its size (when it has one), the hand-written functions
    of shim_exports.c in the slots the table lists, and in every other slot a function that says which
    table and slot the caller wanted and returns CUDA_ERROR_NOT_SUPPORTED."""
    out = [HEADER, "#pragma once", ""]
    for t, table in enumerate(TABLES):
        listed = {slot.index for slot in table.slots}
        first = 1 if table.sized else 0
        for index in range(first, table.words):
            if index not in listed:
                out.append(
                    f"static CUresult gp_x_refuse_{t}_{index}(uint64_t a, uint64_t b, uint64_t c, uint64_t d) "
                    f"{{ return gp_export_refused({t}, {index}, a, b, c, d); }}"
                )
    out.append("")
    for t, table in enumerate(TABLES):
        by_index = {slot.index: slot.function for slot in table.slots}
        words = [f"(void *)({table.words} * sizeof(void *))"] if table.sized else []
        for index in range(1 if table.sized else 0, table.words):
            words.append(f"(void *){by_index.get(index, f'gp_x_refuse_{t}_{index}') or 'NULL'}")
        out.append(f"/* {table.name} {{{table.uuid}}} */")
        out.append(f"static void *const gp_export_{table.name}[{table.words}] = {{")
        out.extend(f"    {word}," for word in words)
        out.append("};")
    out.append("")
    out.append("static const struct gp_export_table gp_export_tables[] = {")
    for table in TABLES:
        key = ", ".join(f"0x{b:02x}" for b in table.key)
        out.append(f'    {{"{table.name}", {{{key}}}, gp_export_{table.name}}},')
    out.append("};")
    return "\n".join(out) + "\n"


# How the native loop checks each argument of a served call: the guard's checks by the argument's
# type (`Session._check`: handles by kind, a device pointer inside the lease's memory).
NATIVE_CHECKS = {
    "stream": "GPF_STREAM",
    "event": "GPF_EVENT",
    "func": "GPF_FUNC",
    "graphexec": "GPF_GRAPHEXEC",
    "dptr": "GPF_RANGE",
}
NATIVE_OUT_BYTES = 8  # a served call's answer: at most one fixed-size value of up to this many bytes
NO_ARG = 0xFF  # an argument index that is none


class UncheckedArgument(VirtualizeError):
    """A call the native loop is to serve has an argument the guard checks and C does not."""


def native_args(call: Call) -> list[str]:
    """Each in-argument of a served call as C's struct gpf_arg: offset, size, check, length argument, and
    the bytes each counted element of that length is."""
    lengths = dict(_guard_rules.range_positions(call))
    pinned = dict(_guard_rules.pinned_positions(call))
    shared = dict(_guard_rules.shared_positions(call))
    name = call.symbol if call.symbol != "-" else call.name
    one_value = len([p for p in call.outs if p.struct_code]) <= 1 and call.out_struct.size <= NATIVE_OUT_BYTES
    if not one_value and name not in _guard_rules.NATIVE_ANSWERED_IN_PIECES:
        raise UncheckedArgument(
            f"{name} is in _guard_rules.NATIVE_CALLS but the native loop answers at most one value of up "
            f"to {NATIVE_OUT_BYTES} bytes",
            "serve it in Python",
        )
    out, offset = [], 0
    for i, p in enumerate(call.ins):
        size = struct.calcsize("<" + p.struct_code)
        if p.type in (*HANDLE_TYPES, "dptr") and p.type not in NATIVE_CHECKS:
            raise UncheckedArgument(
                f"{name} is in _guard_rules.NATIVE_CALLS but the native loop cannot check its {p.type} "
                f"argument `{p.name}` (it checks {', '.join(NATIVE_CHECKS)})",
                "serve it in Python, or add the check",
            )
        check = (
            "GPF_PINNED"
            if i in pinned
            else "GPF_SHARED"
            if i in shared
            else NATIVE_CHECKS.get(p.type, "GPF_PLAIN")
        )
        length = pinned.get(i, shared.get(i, lengths.get(i, NO_ARG)))
        element = _guard_rules.element_bytes(call) if i in lengths else 1
        out.append(f"{{{offset}, {size}, {check}, {length}, {element}}}")
        offset += size
    return out


def moves_client_bytes(call: Call) -> bool:
    """A copy between the lease's memory and bytes in its frame (to the device) or reply (to the host)."""
    return bool(_guard_rules.range_positions(call)) and any(
        p.type in ("bytes", "buf") for p in call.wire_params
    )


def generate_native() -> str:
    """The worker's native loop's share of the wire and of the guard: the frame layout, the ids of the
    calls it serves (`_guard_rules.NATIVE_CALLS`) with each argument's offset and the guard's check of it,
    and which copies a stream capture refuses. dispatch.c hand-codes none of these."""
    request = _wire.offsets(_wire.REQUEST, _wire.REQUEST_FIELDS)
    reply = _wire.offsets(_wire.REPLY, _wire.REPLY_FIELDS)
    served = _guard_rules.native_calls()
    most = max(len(c.ins) for c in served)
    out = [
        HEADER,
        "#pragma once",
        "",
        "#include <stdint.h>",
        "",
        "/* The call table this was generated from (gpf_wire_version: the worker loads no other). */",
        f"#define GPF_WIRE_VERSION 0x{WIRE_VERSION:08x}u",
        "/* A request's header and a reply's (virtualize/common/_wire.py REQUEST, REPLY): sizes, field offsets. */",
        f"#define GPF_REQUEST_BYTES {_wire.REQUEST.size}",
        *(f"#define GPF_REQUEST_{name.upper()} {at}" for name, at in request.items()),
        f"#define GPF_REPLY_BYTES {_wire.REPLY.size}",
        *(f"#define GPF_REPLY_{name.upper()} {at}" for name, at in reply.items()),
        f"#define GPF_FLAG_WANTS_REPLY {_wire.FLAG_WANTS_REPLY}u",
        f"#define GPF_LAUNCH_ATTRIBUTE_BYTES {_wire.LAUNCH_ATTRIBUTE_BYTES}",
        f"#define GPF_MAX_EVENT_PAIRS {_wire.MAX_EVENT_PAIRS}u",
        f"#define GPF_EVENT_NAME_TAG 0x{_wire.EVENT_NAME_TAG:x}ull /* a value the client names an event by */",
        f"#define GPF_EVENT_PAIR_BYTES {_wire.EVENT_PAIR.size}",
        f"#define GPF_EVENT_ELAPSED_BYTES {_wire.EVENT_ELAPSED.size}",
        f"#define GPF_FORWARDED_LAUNCH_ATTRIBUTES {launch_attribute_mask()}",
        f"#define GPF_EVENT_LAUNCH_ATTRIBUTES {launch_attribute_mask(EVENT_LAUNCH_ATTRIBUTES)}",
        "",
        "/* The calls served here (virtualize/server/_guard_rules.py NATIVE_CALLS), in that order. */",
        "enum {",
        *(f"    C_{name}, /* {symbol} */" for symbol, name in _guard_rules.NATIVE_CALLS.items()),
        "    C_COUNT",
        "};",
        "",
        "/* How the guard checks an argument (virtualize/server/_guard_rules.py): a handle of the lease's of that",
        " * kind, or device bytes inside one of the lease's allocations (`length`: the argument holding their",
        " * count, DEVICE_RANGES, in elements of `element` bytes, ELEMENT_BYTES; none: the pointer alone);",
        " * GPF_PINNED: the client's page-locked memory shared with the worker (PINNED_RANGES); GPF_SHARED: an",
        " * offset of the memory the connection shares with its process on this host (SHARED_RANGES). */",
        "enum { GPF_PLAIN, GPF_STREAM, GPF_EVENT, GPF_FUNC, GPF_GRAPHEXEC, GPF_RANGE, GPF_PINNED, GPF_SHARED };",
        "/* A stream every context has (_guard_rules.BUILTIN_STREAMS): no lease's own, always allowed. */",
        "#define GPF_BUILTIN_STREAM(s) ("
        + " || ".join(f"(s) == {n}" for n in sorted(_guard_rules.BUILTIN_STREAMS))
        + ")",
        f"#define GPF_NO_ARG {NO_ARG}",
        "struct gpf_arg { uint8_t offset, size, check, length, element; };",
        "struct gpf_call {",
        "    uint32_t id, args_bytes;",
        "    uint8_t sync;    /* a synchronising call: it answers, with an earlier asynchronous error first */",
        "    uint8_t replies; /* answered when the frame asks (not an asynchronous call) */",
        f"    uint8_t outs;    /* bytes of its one answered value (at most {NATIVE_OUT_BYTES}), or 0; a call"
        " answered in pieces (NATIVE_ANSWERED_IN_PIECES): each piece's */",
        "    uint8_t bulk_in; /* bytes follow its arguments (a launch's parameters, a copy's data) */",
        "    uint8_t data;    /* a copy whose client-side bytes travel in the frame or in the reply */",
        "    uint8_t capture; /* the stream argument on which a capture refuses it (capture_refuses), or none */",
        "    uint8_t n_args;",
        f"    struct gpf_arg args[{most}];",
        "};",
        "static const struct gpf_call gpf_calls[C_COUNT] = {",
    ]
    for call, name in zip(served, _guard_rules.NATIVE_CALLS.values(), strict=True):
        streams = [i for i, p in enumerate(call.ins) if p.type == "stream"]
        refused = _guard_rules.capture_refuses(call) and moves_client_bytes(call)  # not device to device
        capture = streams[0] if streams and refused else NO_ARG
        args = ", ".join(native_args(call)) or "{0}"  # ISO C: no empty braces
        out.append(
            f"    [C_{name}] = {{{CALL_IDS[call]}, {call.in_struct.size}, {int(call.sync_point)}, "
            f"{int(call.mode is not Mode.ASYNC)}, {call.out_struct.size}, "
            f"{int(call.bulk_in)}, {int(moves_client_bytes(call))}, {capture}, {len(call.ins)}, {{{args}}}}},"
        )
    out.append("};")
    out.append("")
    out.append("/* Each argument's offset by name: GPF_AT_<call>_<argument>. */")
    for call, name in zip(served, _guard_rules.NATIVE_CALLS.values(), strict=True):
        offset = 0
        for p in call.ins:
            out.append(f"#define GPF_AT_{name}_{p.name} {offset}")
            offset += struct.calcsize("<" + p.struct_code)
    return "\n".join(out) + "\n"


def generate_nccl_stubs() -> str:
    """Every name NCCL exports (nccl/nccl_symbols.txt) that nccl_forward.c does not define: a profiling
    name `pnccl…` of a forwarded one is its alias, any other a refusal (GP_STUB)."""
    source = (NCCL_DIR / "nccl_forward.c").read_text()
    defined = set(re.findall(r"GP_EXPORT [\w\s*]*?\b(nccl\w+)\(", source))
    defined |= set(re.findall(r"^GP_COMM_INT\((nccl\w+),", source, re.M))
    names = [
        line.strip()
        for line in (NCCL_DIR / "nccl_symbols.txt").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    out = [
        HEADER.replace(
            "virtualize/common/_calls.py and _wire.py",
            "virtualize/client/nccl/nccl_symbols.txt and nccl_forward.c",
        ),
        "",
    ]
    for name in names:
        if name in defined:
            continue
        if name.startswith("p") and name[1:] in defined:
            out.append(f"GP_ALIAS({name}, {name[1:]})")
        else:
            out.append(f"GP_STUB({name})")
    return "\n".join(out) + "\n"


def generated() -> dict[Path, str]:
    """The shim's and the native loop's generated C (the census is _census.generated(): it needs
    cuda-bindings' declarations)."""
    return {
        TYPES_OUTPUT: generate_types(),
        BODIES_OUTPUT: generate_bodies(),
        EXPORTS_OUTPUT: generate_exports(),
        NATIVE_OUTPUT: generate_native(),
        NCCL_STUBS_OUTPUT: generate_nccl_stubs(),
    }


def main() -> int:
    try:
        outputs = generated() | _census.generated()
    except (_census.CensusError, UncheckedArgument) as exc:
        print(f"gpupool: {exc}", file=sys.stderr)
        return 1
    for path, text in outputs.items():
        path.write_text(text)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
