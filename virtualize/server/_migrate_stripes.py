"""The lease's memory on a move between servers, striped across several connections of the link.

One TLS connection carries ~1.3 GB/s: its record layer is one core's work at each end, and one thread reads
the device and writes the socket (measured on two H100s, bench/RESULTS.md). As the data plane's lanes do for a
large copy (`virtualize.server._lanes`), the sending worker opens more connections to the receiving worker's
migrate port (each with the link's handshake: TLS pinned, the one-time secret proven both ways) and sends the
memory over them at once, each stripe by a thread of its own at both ends (Python's ssl encrypts and decrypts
outside the GIL). The main connection keeps everything else, in its order.

`plan` cuts the mappings' bytes, in the manifest's order, into contiguous parts of about equal size (a
mapping may be cut); the manifest carries the plan, the receiving worker checks it against the memory it
mapped (`checked`). One stripe is the link as it was: the memory goes over the main connection, on the
caller's thread. The first stripe that fails (a connection refused or closed, a device read or write, a
timeout) closes every stripe's connection, so the others' blocked reads and writes end at once, and is raised
once all of them have ended: the move fails before its commit as any failure of the link does.
"""

from __future__ import annotations

import bisect
import os
import threading
from collections.abc import Callable

from virtualize.server._migrate import MigrationRefused
from virtualize.server._migrate_link import Link, LinkError

ENV = "GPUPOOL_MIGRATE_STRIPES"  # the sending worker's environment
# Two H100s, TLS, the receiving end in C: 4 GiB paused 3.14 s over 1 stripe, 1.42 s over 4 (3.0 GB/s, what a
# 25 Gbit/s link carries); on a 2-core machine 4 are no faster, and no slower (bench/RESULTS.md).
DEFAULT = 4
MOST = 16


def wanted() -> int:
    """How many connections the memory goes over (`GPUPOOL_MIGRATE_STRIPES`; MigrationRefused if not 1..MOST)."""
    raw = os.environ.get(ENV, "").strip()
    if not raw:
        return DEFAULT
    count = int(raw) if raw.isdecimal() else 0
    if not 1 <= count <= MOST:
        raise MigrationRefused(f"{ENV}={raw!r} is not a whole number from 1 to {MOST} (the connections the "
                               f"lease's memory goes over; default {DEFAULT})")  # fmt: skip
    return count


def plan(memory: list, stripes: int) -> list[list[list[int]]]:
    """The byte ranges [address, size, device] each of `stripes` connections carries: the bytes of `memory`
    ([base, size, device] each, in order) cut into `stripes` contiguous parts of about equal size."""
    total = sum(size for _, size, _ in memory)
    cuts = [total * k // stripes for k in range(stripes + 1)]
    parts: list[list[list[int]]] = [[] for _ in range(stripes)]
    at, k = 0, 0  # where the mapping starts among all the bytes; the part that holds byte `start`
    for base, size, device in memory:
        start = at
        while start < at + size:
            while cuts[k + 1] <= start:
                k += 1
            end = min(at + size, cuts[k + 1])
            parts[k].append([base + start - at, end - start, device])
            start = end
        at += size
    return parts


def checked(stripes, memory: list, links: int) -> list[list[list[int]]]:
    """The manifest's plan, if it gives `links` connections ranges that lie in its memory (on their device)
    and cover all of it; else MigrationRefused."""
    held = sorted((int(base), int(size), int(device)) for base, size, device in memory)
    bases = [base for base, _, _ in held]

    def inside(address: int, size: int, device: int) -> bool:
        i = (
            bisect.bisect_right(bases, address) - 1
        )  # the mapping that starts at or before it (thousands: no scan)
        return size > 0 and i >= 0 and address + size <= held[i][0] + held[i][1] and device == held[i][2]

    try:
        ranges = [(int(a), int(n), int(d)) for part in stripes for a, n, d in part]
        ok = len(stripes) == links and all(inside(*r) for r in ranges)
    except (TypeError, ValueError):
        ok = False
    if not ok or sum(n for _, n, _ in ranges) != sum(size for _, size, _ in held):
        raise MigrationRefused(f"the manifest does not say which of the lease's bytes each of the {links} "
                               f"connection(s) of the link carries")  # fmt: skip
    return stripes


def send(executor, links: list[Link], parts: list, contexts: dict[int, int]) -> None:
    """Each part's ranges read from the device (`executor`: the CUDA executor itself, real addresses and
    contexts; `contexts`: one of each device, current while its ranges are read) and written to its link."""

    def stripe(link: Link, ranges: list) -> None:
        size = sum(n for _, n, _ in ranges)
        link.send({"memory": size}, size)
        for address, size, _ in _in_context(executor, ranges, contexts):
            executor.copy_from_device(address, size, None, link.send_bytes)

    _each(executor, links, parts, stripe)


def receive(
    executor, links: list[Link], parts: list, contexts: dict[int, int], landed: Callable[[int], None]
):
    """Each part's ranges read from its link into the memory mapped for them; `landed(n)` after each chunk (from
    the stripes' threads)."""

    def stripe(link: Link, ranges: list) -> None:
        want = sum(n for _, n, _ in ranges)
        if link.receive().get("memory") != want or link.bulk_left != want:
            raise LinkError(f"a connection of the link does not carry the {want} bytes the manifest gives it")

        def fill(view: memoryview) -> None:
            link.read_into(view)
            landed(len(view))

        for address, size, _ in _in_context(executor, ranges, contexts):
            executor.copy_to_device(address, size, None, fill)

    _each(executor, links, parts, stripe)


def _in_context(executor, ranges: list, contexts: dict[int, int]):
    """The ranges, each with its device's context current on this thread."""
    current = None
    for address, size, device in ranges:
        if contexts[device] != current:
            current = contexts[device]
            executor.set_context(current)
        yield address, size, device


def _each(executor, links: list[Link], parts: list, stripe: Callable[[Link, list], None]) -> None:
    """`stripe(link, ranges)` for each link, on a thread of its own (one link: on this thread); the first
    failure closes every link and is raised once all threads have ended."""
    if len(links) == 1:
        stripe(links[0], parts[0])
        return
    failures: list[Exception] = []
    lock = threading.Lock()

    def run(link: Link, ranges: list) -> None:
        try:
            stripe(link, ranges)
        except Exception as exc:
            with lock:
                failures.append(exc)
                if len(failures) == 1:  # the others' blocked reads and writes end now, not at their timeout
                    for other in links:
                        other.abort()
        finally:
            executor.end_thread()  # its page-locked staging buffers, while their contexts are alive

    threads = [threading.Thread(target=run, args=(link, ranges), name=f"gpupool-stripe-{i}", daemon=True)
               for i, (link, ranges) in enumerate(zip(links, parts, strict=True))]  # fmt: skip
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures:
        raise failures[0]
