"""The lease's memory on a move between servers, striped across several connections of the link
(virtualize.server._migrate_stripes): the plan that cuts the mappings' bytes, and the stripes themselves over
real TLS connections made by the link's handshake, between two real host executors, in process. (Whole moves
between two gpupool-servers: tests/test_pool_migrate_server.py.)"""

from __future__ import annotations

import socket
import threading
import time

import pytest

from virtualize.server import _data_tls, _migrate_link, _migrate_out, _migrate_stripes, _native_tls
from virtualize.server._executor import CudaError
from virtualize.server._executor_host import HostExecutor
from virtualize.server._migrate import MigrationRefused

MiB = 1 << 20
SECRET = b"s" * 32
TIMEOUT_S = 20.0  # each connection's read and write limit here


def covered(parts: list) -> list[tuple[int, int, int]]:
    """The ranges the parts carry, in order: (first address, the address after the last, device) each."""
    return [(address, address + size, device) for part in parts for address, size, device in part]


def test_the_plan_cuts_the_mappings_bytes_into_equal_contiguous_parts_a_mapping_split_between_two():
    """The bytes of the mappings, in order, go into N parts of sizes differing by at most one byte, each byte
    in exactly one part and in order (a mapping cut where a part ends goes on in the next), each range naming
    its mapping's device; one part is the mappings as they are; more parts than bytes leaves some empty."""
    memory = [[0x1000_0000, 3 * MiB, 0], [0x2000_0000, 4096, 1], [0x3000_0000, 5 * MiB, 0]]
    total = sum(size for _, size, _ in memory)
    parts = _migrate_stripes.plan(memory, 4)
    sizes = [sum(n for _, n, _ in part) for part in parts]
    assert sum(sizes) == total and max(sizes) - min(sizes) <= 1
    merged: list[list[int]] = []  # adjacent ranges joined again: the mappings themselves
    for start, end, device in covered(parts):
        if merged and merged[-1][0] + merged[-1][1] == start and merged[-1][2] == device:
            merged[-1][1] += end - start
        else:
            merged.append([start, end - start, device])
    assert merged == memory
    assert len(covered(parts)) > len(memory)  # a mapping was cut: its pieces went to two parts
    assert _migrate_stripes.plan(memory, 1) == [memory]
    few = _migrate_stripes.plan([[0x1000, 3, 0]], 8)
    assert sum(n for part in few for _, n, _ in part) == 3 and sum(1 for part in few if part) == 3


def test_a_manifest_whose_plan_does_not_cover_the_memory_is_refused():
    """The receiving worker takes a plan only if it gives each of its connections ranges inside the memory it
    mapped (on the same device) that add up to all of it: a range outside, a byte missing, a wrong device, or
    another number of connections fails the move."""
    memory = [[0x1000_0000, 2 * MiB, 0]]
    good = _migrate_stripes.plan(memory, 2)
    assert _migrate_stripes.checked(good, memory, 2) == good
    for bad, links in (
        (good, 3),
        ([[[0x1000_0000, MiB, 0]], [[0x1000_0000 + MiB, MiB, 1]]], 2),  # the wrong device
        ([[[0x1000_0000, MiB, 0]], [[0x1000_0000 + MiB, MiB - 1, 0]]], 2),  # a byte missing
        ([[[0x1000_0000, MiB, 0]], [[0x1000_0000 + MiB, MiB + 1, 0]]], 2),  # past the mapping
        ([[["x", 1, 0]]], 1),
        (None, 1),
    ):
        with pytest.raises(MigrationRefused):
            _migrate_stripes.checked(bad, memory, links)


def test_a_stripe_count_outside_its_range_is_refused_with_its_name(monkeypatch):
    """GPUPOOL_MIGRATE_STRIPES: unset means 4 (what carried a 25 Gbit/s link's rate on two H100s); 1..16 as
    given; anything else refuses the move naming the variable (before anything pauses)."""
    monkeypatch.delenv(_migrate_stripes.ENV, raising=False)
    assert _migrate_stripes.wanted() == 4
    for value, count in (("1", 1), (" 16 ", 16)):
        monkeypatch.setenv(_migrate_stripes.ENV, value)
        assert _migrate_stripes.wanted() == count
    for value in ("0", "17", "-2", "four", "2.5"):
        monkeypatch.setenv(_migrate_stripes.ENV, value)
        with pytest.raises(MigrationRefused, match=_migrate_stripes.ENV):
            _migrate_stripes.wanted()


def linked(
    count: int, tmp_path, native: bool = False
) -> tuple[list[_migrate_link.Link], list[_migrate_link.Link]]:
    """`count` connections made as the link makes them (TLS pinned, the secret proven both ways): the sending
    ends and the receiving ends, in the same order (`native`: the receiving ends' TLS in C, as a worker with
    the native library has it)."""
    tls, fingerprint = _data_tls.server_context(tmp_path, "stripes")
    in_c = _native_tls.server_context(tmp_path) if native else None
    if native and in_c is None:
        pytest.skip("the native library is not built here")
    listener = socket.create_server(("127.0.0.1", 0))
    received: list[_migrate_link.Link] = []

    def accept() -> None:
        for _ in range(count):
            sock, _ = listener.accept()
            received.append(_migrate_link.accept(sock, tls, SECRET, TIMEOUT_S, native_tls=in_c))

    accepting = threading.Thread(target=accept)
    accepting.start()
    port = listener.getsockname()[1]
    sent = [_migrate_link.connect("127.0.0.1", port, fingerprint, SECRET, TIMEOUT_S) for _ in range(count)]
    accepting.join(10)
    listener.close()
    assert len(received) == count
    return sent, received


def two_executors(memory: list) -> tuple[HostExecutor, HostExecutor]:
    """A sending and a receiving host executor with `memory` mapped at the same addresses; the sender's filled
    with a pattern of its own per mapping, the receiver's zero."""
    source, target = HostExecutor([64 * MiB, 64 * MiB]), HostExecutor([64 * MiB, 64 * MiB])
    for executor in (
        source,
        target,
    ):  # this thread's copies below and in read_back need a context, as the driver's
        executor.set_context(executor.cuDevicePrimaryCtxRetain(0))
    for i, (base, size, device) in enumerate(memory):
        for executor in (source, target):
            assert executor.reserve_addresses(size, base) == base
            executor.map_memory(base, size, device)
        pattern = bytes((i * 31 + j * 7) % 251 for j in range(4093))
        data = memoryview((pattern * (size // len(pattern) + 1))[:size])
        at = 0

        def fill(view: memoryview, data=data) -> None:
            nonlocal at
            view[:] = data[at : at + len(view)]
            at += len(view)

        source.copy_to_device(base, size, None, fill)
    return source, target


def read_back(executor: HostExecutor, base: int, size: int) -> bytes:
    out = bytearray()
    executor.copy_from_device(base, size, None, lambda view: out.extend(view))
    return bytes(out)


def primary(executor: HostExecutor, devices) -> dict[int, int]:
    return {device: executor.cuDevicePrimaryCtxRetain(device) for device in devices}


def both_ends(source, target, memory, parts, sent, received) -> dict:
    """The sender's and the receiver's stripes run at once, each end on a thread of its own, as the two workers
    do; what each raised (None: nothing), how long each took, the bytes the receiver counted, and the stripe
    threads still alive once both returned."""
    out: dict = {"landed": 0}
    lock = threading.Lock()

    def landed(n: int) -> None:
        with lock:
            out["landed"] += n

    def end(name, work) -> None:
        started = time.monotonic()
        try:
            work()
            out[name] = None
        except Exception as exc:
            out[name] = exc
        out[f"{name}_s"] = time.monotonic() - started

    devices = {device for _, _, device in memory}
    ends = [
        threading.Thread(target=end, args=("sender", lambda: _migrate_stripes.send(
            source, sent, parts, primary(source, devices)))),
        threading.Thread(target=end, args=("receiver", lambda: _migrate_stripes.receive(
            target, received, parts, primary(target, devices), landed))),
    ]  # fmt: skip
    for thread in ends:
        thread.start()
    for thread in ends:
        thread.join(2 * TIMEOUT_S)
    out["alive"] = [t.name for t in threading.enumerate() if t.name.startswith("gpupool-stripe")]
    for link in sent + received:
        link.close()
    return out


MEMORY = [[0x5E00_0000_0000, 6 * MiB, 0], [0x5E00_0100_0000, 64 << 10, 1], [0x5F00_0000_0000, 10 * MiB, 0]]


@pytest.mark.parametrize("tls_in_c", [False, True], ids=["python-tls", "tls-in-c"])
def test_striped_memory_arrives_byte_for_byte_at_the_same_addresses(tmp_path, tls_in_c):
    """Three mappings on two devices (one cut between two stripes, another carried by one alone) sent over four
    TLS connections at once (received through Python's ssl, or the worker's TLS in C): the receiving executor
    holds every byte at the same address, counted as it landed, and no stripe thread is left."""
    source, target = two_executors(MEMORY)
    parts = _migrate_stripes.plan(MEMORY, 4)
    sent, received = linked(4, tmp_path, tls_in_c)
    assert all(hasattr(link.sock, "recv_into_all") == tls_in_c for link in received)
    out = both_ends(source, target, MEMORY, parts, sent, received)
    assert out["sender"] is None and out["receiver"] is None, out
    assert out["landed"] == sum(size for _, size, _ in MEMORY) and not out["alive"]
    for base, size, _ in MEMORY:
        assert read_back(target, base, size) == read_back(source, base, size)


@pytest.mark.parametrize("tls_in_c", [False, True], ids=["python-tls", "tls-in-c"])
@pytest.mark.parametrize("side", ["sender", "receiver"])
def test_a_stripe_whose_device_copy_fails_ends_every_stripe_at_both_ends_at_once(tmp_path, side, tls_in_c):
    """One stripe's device read (at the sender) or write (at the receiver) fails: that end raises the device's
    error, the other end's stripes fail too, both within seconds — long before the connections' own timeout —
    and no stripe thread is left at either end (each end closes every stripe's connection at the first
    failure, so the others' blocked reads and writes end)."""
    memory = [[0x5E00_0000_0000, 48 * MiB, 0], [0x5F00_0000_0000, 16 * MiB, 1]]  # more than sockets buffer
    source, target = two_executors(memory)
    broken = source if side == "sender" else target
    base, size, _ = memory[1]  # the last stripe's mapping is gone there: its copy fails with ILLEGAL_ADDRESS
    broken.unmap_memory(base, size, None)
    parts = _migrate_stripes.plan(memory, 4)
    sent, received = linked(4, tmp_path, tls_in_c)
    out = both_ends(source, target, memory, parts, sent, received)
    other = "receiver" if side == "sender" else "sender"
    assert isinstance(out[side], CudaError), out
    assert isinstance(out[other], OSError | _migrate_link.LinkError), out
    assert out["sender_s"] < TIMEOUT_S / 2 and out["receiver_s"] < TIMEOUT_S / 2, out
    assert not out["alive"], out


def test_a_sender_whose_memory_did_not_all_go_reports_the_receiving_workers_reason(tmp_path):
    """The sender's stripes broke: if the receiving worker said why on the first connection (a device write
    failing there), the move fails with that reason; if it went without a word, the sender's own failure stands
    (nothing raised here, at once)."""
    sent, received = linked(2, tmp_path)
    received[0].send({"ok": False, "error": "the lease could not be re-created here: CUresult 709"})
    with pytest.raises(MigrationRefused, match="709"):
        _migrate_out._said_why(sent[0], "b:1")
    received[1].close()
    started = time.monotonic()
    assert _migrate_out._said_why(sent[1], "b:1") is None
    assert time.monotonic() - started < _migrate_out.REASON_WAIT_S
    for link in sent + received:
        link.close()
