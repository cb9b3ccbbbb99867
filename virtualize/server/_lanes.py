"""Copies striped across a process's extra connections ("lanes"): the worker's meeting point.

One encrypted connection moves 1.2-1.9 GB/s on a fast host: TLS's record layer is one core's work on
each side (bench/RESULTS.md, issue 12), below what a 25 Gbit/s link carries. A process whose data
connection is encrypted opens a few more connections to its worker (`gpLaneAttach`, proving the same
lease secret) and sends a large copy in pieces, one per lane, each lane's TLS on its own thread at both
ends. The copy itself is a frame on the process's own connection (`gpLaneCopy`), so it happens in
order with everything sent before it: the worker's connection thread checks it like any copy, then
lets the lanes' pieces run (`gpLanePiece`), and goes on with the next frame only when every piece is
done — a kernel launched after the copy sees all of its bytes.

The lanes' threads and the owning connection's thread meet here, per copy id. A piece may arrive
before its copy's frame (it waits), a copy refused by its checks lets its pieces through without
touching memory, and a lane that goes away fails the copies still waiting, so nothing waits forever.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from virtualize.common._results import CUresult

WAIT_S = 60.0  # no piece for this long: the copy fails (the client stopped sending)
LANE_GO_FIRST = 4  # gpLaneCopy's flag: answer once before the pieces come (and, to the device, only then)
# gpLaneCopy's flag: to the device from the client's page-locked memory, its pieces may come after the process's
# next frames. Where the executor can (`Executor.lane_staged`) the copy is queued behind a mark its stream waits
# for, the connection goes on at once, and the pieces land in the copy's staging buffer; elsewhere (or without
# the flag) the connection waits for the pieces as before.
LANE_LATER = 8


@dataclass
class LaneCopy:
    """One striped copy: what the owning connection allowed, and how its pieces went."""

    pieces: int = 0
    released: bool = False  # checked by the owning connection: its pieces may run
    allowed: bool = False  # released and fit to touch memory (else pieces are consumed, not run)
    device: int = 0
    count: int = 0
    stream: int | None = None
    ctx: int = 0
    to_device: bool = True
    done: int = 0  # pieces finished, well or not
    error: int = 0  # the first error, reported by the copy's answer (or as an asynchronous error)
    staged: object = None  # queued already (LANE_LATER): its pieces fill this (`view`, then `filled()`)


class Lanes:
    """The copies of one process connection that its lanes are carrying."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._copies: dict[int, LaneCopy] = {}
        self.attached = 0  # lanes joined
        self.lost = False  # a lane went away: waiting copies fail, later ones go to the caller
        self.unmovable = (
            False  # a copy came without LANE_GO_FIRST (an older shim): the lease cannot move away
        )

    def _entry(self, ident: int) -> LaneCopy:
        copy = self._copies.get(ident)
        if copy is None:
            copy = self._copies[ident] = LaneCopy()
        return copy

    def release(self, ident: int, pieces: int, allowed: bool, error: int, **where) -> LaneCopy:
        """The owning connection has checked copy `ident`: its pieces may run (or be consumed)."""
        with self._cond:
            copy = self._entry(ident)
            copy.pieces, copy.allowed, copy.error = pieces, allowed, copy.error or error
            for name, value in where.items():
                setattr(copy, name, value)
            copy.released = True
            self._cond.notify_all()
            return copy

    def wait_done(self, ident: int) -> LaneCopy:
        """Until every piece of `ident` has finished (or a lane is lost, or nothing moves for WAIT_S)."""
        with self._cond:
            copy = self._copies[ident]
            while copy.done < copy.pieces and not self.lost:
                before = copy.done
                self._cond.wait(WAIT_S)
                if copy.done == before and not self.lost:
                    break  # no piece finished for WAIT_S: the client stopped sending
            if copy.done < copy.pieces:
                copy.error = copy.error or CUresult.DEVICE_UNAVAILABLE
            del self._copies[ident]
            return copy

    def piece(self, ident: int) -> LaneCopy | None:
        """A lane's piece of `ident`: the copy once its owner has checked it; None if a lane was lost or
        the owner never released it in time."""
        with self._cond:
            copy = self._entry(ident)
            if not copy.released:
                self._cond.wait_for(lambda: copy.released or self.lost, WAIT_S)
            if not copy.released:
                self._copies.pop(ident, None)
                return None
            return copy

    def piece_done(self, copy: LaneCopy, error: int = 0) -> bool:
        """A piece has finished; True when it was the last of a queued copy (whose stream then goes on)."""
        with self._cond:
            copy.done += 1
            copy.error = copy.error or error
            self._cond.notify_all()
            if copy.staged is None or copy.done < copy.pieces:
                return False
            self._copies = {k: v for k, v in self._copies.items() if v is not copy}  # nobody waits for it
        copy.staged.filled()
        return True

    def lane_lost(self) -> None:
        """A lane went away: copies waiting for pieces fail; a queued one's stream goes on without its bytes."""
        with self._cond:
            self.lost = True
            self._cond.notify_all()
            queued = [c for c in self._copies.values() if c.staged is not None and c.done < c.pieces]
            for copy in queued:
                copy.error = copy.error or CUresult.DEVICE_UNAVAILABLE
                copy.done = copy.pieces
        for copy in queued:
            copy.staged.filled()
