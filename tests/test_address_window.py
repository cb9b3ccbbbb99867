"""The worker's side of the address windows (virtualize/server/_address_window.py), with the host executor:
where allocations land, that small ones share pages, that freed space is found again, and that a full
window says so (the guard then lets the driver allocate); and, between the process workers of one lease,
which ranges each notes so that new windows keep clear of them (virtualize/server/_ipc_workers.py)."""

from __future__ import annotations

import os

import pytest

from virtualize.server._address_window import GRANULE, SMALL_ALIGN, FreeRanges, WindowFull, WindowMemory
from virtualize.server._executor_guard import LeaseState
from virtualize.server._executor_host import HostExecutor
from virtualize.server._ipc_workers import Imports, Neighbours

MiB = 1 << 20


def test_free_ranges_take_the_best_fit_and_merge_back_into_one():
    free = FreeRanges(0, 100)
    a, b, c = free.take(10), free.take(30), free.take(10)
    assert (a, b, c) == (0, 10, 40)
    free.give(b, 30)
    assert free.take(25) == 10  # the hole, not the tail
    free.give(10, 25)
    free.give(a, 10)
    free.give(c, 10)
    assert free.empty(0, 100)


@pytest.fixture
def window():
    executor = HostExecutor([64 * MiB])
    executor.set_context(executor.cuDevicePrimaryCtxRetain(0))
    memory = WindowMemory(executor, [64 * MiB], size=8 * MiB)
    base, size = memory.offer()
    memory.accept(base)
    yield memory, base, size, executor
    memory.close()


def test_allocations_land_inside_the_window_small_ones_sharing_a_page(window):
    memory, base, size, _ = window
    small = [memory.allocate(n, 0) for n in (1, 700, 4096)]
    big = memory.allocate(3 * MiB, 0)
    assert all(base <= p < base + size for p in [*small, big])
    assert {p // GRANULE for p in small} == {small[0] // GRANULE}
    assert small[1] - small[0] == SMALL_ALIGN and small[2] - small[1] == 1024
    assert big % GRANULE == 0
    with pytest.raises(WindowFull):  # 2 MiB slab + 4 MiB: 2 MiB left, and 3 MiB asked
        memory.allocate(3 * MiB, 0)
    memory.free(big)
    assert memory.allocate(3 * MiB, 0) == big  # the space came back


def test_a_stream_ordered_free_gives_the_space_back_once_the_stream_gets_there(window):
    memory, _, _, executor = window
    first = memory.allocate(4 * MiB, 0)
    memory.allocate(2 * MiB, 0)
    stream = executor.cuStreamCreate(0)
    memory.free_after(first, stream)
    assert memory.allocate(4 * MiB, 0) == first  # the host executor's streams are always done


def test_an_offer_the_client_did_not_take_is_released_when_another_is_made():
    executor = HostExecutor([64 * MiB])
    memory = WindowMemory(executor, [64 * MiB], size=8 * MiB)
    first, _ = memory.offer()
    memory.offer()
    assert first not in executor.reserved
    with pytest.raises(Exception, match="not the window offered"):
        memory.accept(first)


def test_a_worker_notes_the_other_workers_windows_it_holds_so_no_new_window_is_drawn_over_them(tmp_path):
    """A process worker that maps another's pages holds that worker's whole window reserved; its note in the
    state folder names that range beside its own windows, so a worker started later keeps clear of it even
    once the exporter (and its own note) has gone, and drops it once the last page is unmapped."""
    executor = HostExecutor([64 * MiB])
    importer = Neighbours(tmp_path)
    importer.note([(0x7000_0000_0000, 64 << 30)])  # its own window
    exporter_window = (0x5000_0000_0000, 64 << 30)
    (tmp_path / "windows-1").write_text(f"{exporter_window[0]:x} {exporter_window[1]:x}\n")  # pid 1: running
    imports = Imports(tmp_path, executor, importer, LeaseState([64 * MiB]))
    with imports.lock:
        base = imports.reserve_window(exporter_window[0] + (2 << 20), 2 << 20)
    assert base == exporter_window[0]
    (tmp_path / "windows-1").unlink()  # the exporter has gone
    noted = (tmp_path / f"windows-{os.getpid()}").read_text().split("\n")
    assert f"{exporter_window[0]:x} {exporter_window[1]:x}" in noted
    assert f"{0x7000_0000_0000:x} {64 << 30:x}" in noted
    assert exporter_window in importer.taken()
    with imports.lock:
        imports.release_window(base)
    assert f"{exporter_window[0]:x}" not in (tmp_path / f"windows-{os.getpid()}").read_text()
