"""What a move to another server's worker carries that the executor re-creates itself (docs/remote.md, "Between
servers"): CUDA arrays and mipmapped arrays (shape and bytes), texture and surface objects (their descriptors,
made anew with the same values), and the program's own virtual memory (each cuMemCreate allocation, its bytes,
its mappings at the same addresses and the access granted there).

The sending worker describes them as the client names them (`exported`: JSON for the manifest, and the byte
pieces, which follow the lease's memory on the link in that order); the receiving worker makes them anew in the
contexts its replay of the records made, fills them from the link, and maps the client's handle values to the
new objects (`imported`). A move between GPUs of one server does the same in the executor itself
(`Executor.migrate`); this is its counterpart across hosts, built on the executor's ordinary calls.

Texture and surface objects keep their values: a kernel holds them in its parameters, where the worker does not
look. A fresh context gives them out in order, so they are made in order of value, a value destroyed since
skipped by making a spare and letting it go; a value the target's driver does not give back fails the move
before it commits.
"""

from __future__ import annotations

import base64
import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from virtualize.server._arrays import ARRAY, HOST, ArrayShape, resource_mapped
from virtualize.server._executor import NOT_SUPPORTED, CopySide, CudaError

CHUNK = 4 << 20  # bytes of an array read or written at a time (host memory of the move stays bounded)
SPARE_SAMPLERS = (
    4096  # texture/surface values destroyed before the last one, made and let go of on the target
)
READ_WRITE = 3  # CU_MEM_ACCESS_FLAGS_PROT_READWRITE: a scratch mapping's, while its bytes are copied


@dataclass
class Piece:
    """`size` bytes of the carried objects, handed to `send` chunk by chunk by `read(send)`, in order."""

    size: int
    read: Callable[[Callable[[memoryview], None]], None]


def refusal(executor) -> str | None:
    """What the executor holds that a move to another server cannot make anew there, or None."""
    reason = executor.inner.carry_refusal()
    return f"the lease holds {reason}, which a move to another server does not carry" if reason else None


def _shape_json(shape: ArrayShape) -> list[int]:
    return [shape.width, shape.height, shape.depth, shape.format, shape.channels, shape.flags]


def _b64(raw: bytes | None) -> str | None:
    return None if raw is None else base64.b64encode(bytes(raw)).decode()


def _unb64(text: str | None) -> bytes | None:
    return None if text is None else base64.b64decode(text)


def _bands(shape: ArrayShape) -> Iterator[tuple[int, int, int]]:
    """(row, slice, rows) of an array, a band of rows at a time (at most CHUNK bytes, at least one row)."""
    step = max(1, CHUNK // shape.row_bytes)
    for z in range(shape.slices):
        for y in range(0, shape.rows, step):
            yield y, z, min(step, shape.rows - y)


def _array_side(array: int, y: int, z: int) -> CopySide:
    return CopySide(ARRAY, array, 0, y, z, 0, 0)


def _host_side(row_bytes: int, rows: int) -> CopySide:
    return CopySide(HOST, 0, 0, 0, 0, row_bytes, rows)


# -- the sending end -----------------------------------------------------------------------------------


def exported(translated) -> tuple[dict, list[Piece]]:
    """The executor's arrays, samplers and virtual memory as the client names them (the calls paused), and the
    pieces of their bytes in the order the JSON lists them: arrays, mipmapped arrays' levels, then allocations
    the program holds that are not mapped whole (all of each). The rest of the virtual memory's bytes: `striped`."""
    inner, client = translated.inner, translated.map.client
    held = inner.held_objects()
    pieces: list[Piece] = []

    def array_piece(array: int, ctx: int, shape: ArrayShape) -> None:
        def read(send) -> None:
            inner.set_context(ctx)
            for y, z, rows in _bands(shape):
                data = inner.copy_3d(_array_side(array, y, z), _host_side(shape.row_bytes, rows),
                                     (shape.row_bytes, rows, 1), None, None)  # fmt: skip
                send(memoryview(data))

        pieces.append(Piece(shape.nbytes, read))

    arrays = []
    for array, ctx, shape in held.arrays:
        arrays.append([client("array", array), client("ctx", ctx), _shape_json(shape)])
        array_piece(array, ctx, shape)
    mipmaps = []
    for mipmap, ctx, shape, count, levels in held.mipmaps:
        mipmaps.append([client("mipmap", mipmap), client("ctx", ctx), _shape_json(shape), count,
                        [client("array", level) for level in levels]])  # fmt: skip
        for n, level in enumerate(levels):
            array_piece(level, ctx, shape.level(n))
    samplers = [
        [value, client("ctx", ctx), _b64(resource_mapped(res, client)), _b64(tex), _b64(view)]
        for value, ctx, res, tex, view in sorted(held.samplers)
    ]
    allocations = sorted(held.vm, key=lambda v: not v[5])  # held ones first
    through = {v[0]: _whole_mapping(held, *v[:3]) for v in allocations if v[5]}
    for handle, size, device, *_ in (v for v in allocations if v[5] and through[v[0]] is None):
        pieces.append(Piece(size, _whole_read(translated, handle, size, device)))
    # the rest of their bytes lie at the lease's addresses: they go over the stripes with its memory (`striped`)
    return {
        "arrays": arrays,
        "mipmaps": mipmaps,
        "samplers": samplers,
        "vm": [[handle, client("vmem", handle) if kept else None, size, device, types, usage, through.get(handle)]
               for handle, size, device, types, usage, kept in allocations],
        "vm_maps": [list(m) for m in sorted(held.vm_maps)],
        "vm_access": [[at, size, [list(a) for a in access]] for at, size, access in held.vm_access],
    }, pieces  # fmt: skip


def _whole_mapping(held, handle: int, size: int, device: int) -> int | None:
    """Where all of allocation `handle` is mapped at once with read-write access for its device (its bytes are
    read and written there, as PyTorch's expandable segments map each of theirs), or None (a scratch mapping)."""
    for at, n, offset, mapped in held.vm_maps:
        if (
            mapped == handle
            and offset == 0
            and n == size
            and any(
                base <= at and at + n <= base + length and (device, READ_WRITE) in map(tuple, access)
                for base, length, access in held.vm_access
            )
        ):
            return at
    return None


def striped(carried: dict) -> list[list[int]]:
    """The carried virtual memory's bytes that lie at the lease's addresses, as [address, size, device]: each
    allocation the program holds that is mapped whole (through that mapping), and each mapping of one that only
    mappings keep. They go over the link's stripes with the lease's memory (an expandable-segments training
    holds nearly all of its memory so), once `vm_mapped` made them on the receiving worker. ValueError: a
    mapping of memory the move does not carry."""
    vm = carried.get("vm", [])
    device = {source: dev for source, _, _, dev, *_ in vm}
    kept = {source for source, client, *_ in vm if client is None}
    ranges = [[through, size, dev] for _, client, size, dev, *_, through in vm
              if client is not None and through is not None]  # fmt: skip
    for at, size, _, source in carried.get("vm_maps", []):
        if source not in device:
            raise ValueError(f"a mapping at 0x{at:x} of memory the move did not carry")
        if source in kept:
            ranges.append([at, size, device[source]])
    return ranges


@contextlib.contextmanager
def device_contexts(translated, devices):
    """A context of each lease device of `devices`, as the executor names it: one of the lease's, else the
    device's primary context, retained for the while (copies need one current; the lease's own costs nothing)."""
    with contextlib.ExitStack() as retained:
        found = {}
        for device in devices:
            contexts = translated.contexts(device)
            if contexts:
                found[device] = translated.map.real("ctx", contexts[0])
            else:
                found[device] = translated.inner.cuDevicePrimaryCtxRetain(device)
                retained.callback(translated.inner.cuDevicePrimaryCtxRelease, device)
        yield found


@contextlib.contextmanager
def _on_device(translated, device: int):
    """A context of lease device `device` current: copies need one."""
    with device_contexts(translated, [device]) as found:
        translated.inner.set_context(found[device])
        yield


@contextlib.contextmanager
def _scratch_mapped(inner, handle: int, size: int, device: int):
    """All of allocation `handle` mapped at a scratch address of this worker's own (read-write for `device`)."""
    scratch = inner.reserve_addresses(size, 0)
    try:
        inner.cuMemMap(scratch, size, 0, handle, 0)
        try:
            inner.cuMemSetAccess(scratch, size, [(device, READ_WRITE)])
            yield scratch
        finally:
            inner.cuMemUnmap(scratch, size)
    finally:
        inner.release_addresses(scratch, size)


def _whole_read(translated, handle: int, size: int, device: int):
    def read(send) -> None:
        with _on_device(translated, device), _scratch_mapped(translated.inner, handle, size, device) as at:
            translated.inner.copy_from_device(at, size, None, send)

    return read


def send(pieces: list[Piece], send_bytes: Callable[[memoryview], None]) -> None:
    for piece in pieces:
        piece.read(send_bytes)


# -- the receiving end -----------------------------------------------------------------------------------


def vm_devices(carried: dict) -> set[int]:
    """The devices the carried virtual memory lies on."""
    return {dev for _, _, _, dev, *_ in carried.get("vm", [])}


def vm_mapped(inner, carried: dict, contexts: dict[int, int]) -> dict[int, int]:
    """Before the stripes: each carried allocation made anew (same size, device, handle types, usage; the
    device's context of `contexts` current), each mapping made at its address and offset and the access
    granted again, so that the stripes write the `striped` bytes where they were. The source's handle ->
    the new allocation."""
    new: dict[int, int] = {}
    for source, _, size, dev, types, usage, _ in carried.get("vm", []):
        inner.set_context(contexts[dev])
        new[source] = inner.cuMemCreate(size, dev, types, usage)
    for at, size, offset, source in carried.get("vm_maps", []):
        inner.cuMemMap(at, size, offset, new[source], 0)  # (`striped` checked each names a carried one)
    for at, size, access in carried.get("vm_access", []):
        inner.cuMemSetAccess(at, size, [tuple(a) for a in access])
    return new


def imported(translated, carried: dict, read_into: Callable[[memoryview], None], vm: dict[int, int]) -> int:
    """Make the carried objects anew here (the records replayed: the client's contexts map to this worker's),
    their bytes read from the link in the order `exported` sent them; the client's values map to them from now
    on (`vm`: the allocations `vm_mapped` made). How many objects were made. CudaError, ValueError: the move
    fails (this worker is let go)."""
    inner, real = translated.inner, translated.map.real
    made: list[tuple[str, int, int]] = []

    def filled(array: int, shape: ArrayShape) -> None:
        for y, z, rows in _bands(shape):
            band = bytearray(shape.row_bytes * rows)
            read_into(memoryview(band))
            inner.copy_3d(_host_side(shape.row_bytes, rows), _array_side(array, y, z),
                          (shape.row_bytes, rows, 1), None, bytes(band))  # fmt: skip

    for client, ctx, shape_json in carried.get("arrays", []):
        shape = ArrayShape(*shape_json)
        inner.set_context(real("ctx", ctx))
        array = inner.cuArray3DCreate(shape)
        made.append(("array", client, array))
        filled(array, shape)
    for client, ctx, shape_json, count, levels in carried.get("mipmaps", []):
        shape = ArrayShape(*shape_json)
        inner.set_context(real("ctx", ctx))
        mipmap = inner.cuMipmappedArrayCreate(shape, count)
        made.append(("mipmap", client, mipmap))
        for n, level in enumerate(levels):
            new = inner.cuMipmappedArrayGetLevel(mipmap, n)
            made.append(("array", level, new))
            filled(new, shape.level(n))
    for ns, client, new in made:  # before the samplers: their resources name the new arrays
        translated.map.move(ns, client, new)
    made.extend(_vm_imported(translated, carried, read_into, vm))
    _samplers_made(translated, carried.get("samplers", []))
    return len(made) + len(carried.get("samplers", []))


def _vm_imported(translated, carried: dict, read_into, new: dict[int, int]) -> list[tuple[str, int, int]]:
    """The bytes of each allocation the program holds that is not mapped whole, written through a scratch
    mapping (the others' came over the stripes); the allocations only mappings keep let go of; the client's
    handle values mapped to the new allocations."""
    inner = translated.inner
    made = []
    for source, client, size, dev, *_, through in carried.get("vm", []):
        if client is None:
            inner.cuMemRelease(new[source])  # its mappings keep it
            continue
        made.append(("vmem", client, new[source]))
        if through is None:
            with _on_device(translated, dev), _scratch_mapped(inner, new[source], size, dev) as at:
                inner.copy_to_device(at, size, None, read_into)
    for ns, client, real in made:
        translated.map.move(ns, client, real)
    return made


def _samplers_made(translated, samplers: list) -> None:
    """The texture and surface objects made anew in order of value, each with the value the client holds."""
    inner, real = translated.inner, translated.map.real
    spare: list[tuple[bool, int]] = []  # values made before the wanted one: let go of after
    try:
        for value, ctx, res, tex, view in samplers:
            inner.set_context(real("ctx", ctx))
            resource, texture, view_desc = resource_mapped(_unb64(res), real), _unb64(tex), _unb64(view)
            got = _sampler_made(inner, resource, texture, view_desc)
            while got < value and len(spare) < SPARE_SAMPLERS:  # values destroyed since, in between
                spare.append((texture is not None, got))
                got = _sampler_made(inner, resource, texture, view_desc)
            if got != value:
                raise CudaError(NOT_SUPPORTED, f"a texture or surface object would have another value here ({got}, "
                                f"not {value}), and kernels hold its value")  # fmt: skip
    finally:
        for is_texture, value in spare:
            with contextlib.suppress(CudaError):
                (inner.cuTexObjectDestroy if is_texture else inner.cuSurfObjectDestroy)(value)


def _sampler_made(inner, resource: bytes, texture: bytes | None, view: bytes | None) -> int:
    """A texture object (`texture` given) or a surface object over `resource`, in the current context."""
    if texture is None:
        return inner.cuSurfObjectCreate(resource)
    return inner.cuTexObjectCreate(resource, texture, view)
