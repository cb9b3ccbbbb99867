"""Moving a running lease to another server's worker (docs/remote.md, "Between servers"): both ends.

The sending end (`send`, in the lease's worker, asked by its pool server through the request file as a
move to another GPU is): refuse up front what cannot leave this host (`refusal`), open the link to the
receiving worker (`virtualize.server._migrate_link`: TLS, the one-time secret), pause the lease's calls as
a move to another GPU does (`_migrate.Gate`, the native loop leaving frames to Python), drain its
contexts, and send the manifest — the processes' address windows and the memory mapped in them — and then
that memory, chunk by chunk, read from the device as it is, over several connections of the link at once
(`virtualize.server._migrate_stripes`, made before the pause; GPUPOOL_MIGRATE_STRIPES).

The receiving end (`receive`, in a worker started with ``--receive SECONDS``): wait that long for one
sender that proves the secret (and for the connections it then opens), reserve each window at the SAME
address (a range taken on this GPU fails the move), map all the memory there and fill it from the link's
connections, and say what it holds. Then it waits for the sender's decision.

Until the receiving worker holds everything, the lease runs on its source: the sender resumes the calls
whatever failed (the link dropped, the receiving worker died or refused, a timeout), and a receiving
worker whose sender is gone or that no sender reached exits, which frees its GPUs (its server ends the
admission as for any worker that exits).

With the memory, the manifest carries the records the lease's objects are made from (contexts, streams,
events, modules, functions, pools and what configured them: `Translated.exported`, as JSON), the lease's
graphs and instantiated graphs as read here (`Translated.graphs_exported`, in the client's values), what the
executor re-creates itself — CUDA arrays, texture and surface objects, the program's own virtual memory
(`virtualize.server._migrate_carried`; their bytes follow the memory's) — and the guard's state of the lease and
of each process (`virtualize.server._migrate_state`, tensor maps included); the receiving worker replays the
records, builds the graphs after them, maps the client's handle values to what it made, rebuilds the guard's
state and parks each process under a token. On the commit the old worker answers each connection's next frame
that wants a reply with
MOVED (`Moved.frame`; the frames that want none since the pause go over the link and run there first), the
shim reconnects there and resumes (gpResume), and the old worker exits once its processes are gone.
What the move does not carry yet is refused up front (`refusal`, `NOT_CARRIED`).
"""

from __future__ import annotations

import base64
import logging
import os
import socket
import threading
import time

from virtualize.common import _wire
from virtualize.server import _migrate, _migrate_carried, _migrate_link, _migrate_state, _migrate_stripes
from virtualize.server._executor import CudaError
from virtualize.server._executor_guard import Allocation, Session
from virtualize.server._migrate import DRAIN_TIMEOUT_S, MPS_REFUSAL, MigrationRefused

log = logging.getLogger("gpupool.worker")

LINK_TIMEOUT_S = 60.0  # the longest one read or write of the link may take before the move fails
REASON_WAIT_S = 2.0  # how long a sender whose memory did not all go waits for the receiving worker to say why
# Tests only: the receiving worker dies (exit 9, as a killed process) after this many bytes of memory.
DIES_AFTER_ENV = "GPUPOOL_TEST_RECEIVER_DIES_AFTER_BYTES"


def refusal(worker, graphs: bool = True) -> str | None:
    """Why the lease cannot move to another server's worker, or None: what cannot move at all, what only this
    host has, and what the move does not carry yet (a graph's nodes: where `graphs`)."""
    if os.environ.get("CUDA_MPS_PIPE_DIRECTORY"):
        return MPS_REFUSAL
    lease = worker.lease
    if lease.nccl_comms:
        return "the lease holds NCCL communicators: their connections to the other ranks are this worker's"
    if any(session.pinned for session in list(worker.sessions)):
        return (
            "a process of the lease shares page-locked host memory with this worker (on its host): another "
            "server's worker cannot map it"
        )
    reason = _migrate.lease_refusal(worker, set(range(len(worker.devices))))
    if reason:
        return reason
    kinds = _not_carried(worker)
    if kinds:
        return f"the lease holds {', '.join(kinds)}, which a move to another server does not carry yet"
    if graphs:
        try:  # read as the move reads them (the manifest checks again, paused)
            worker.executor.graphs_exported()
        except (CudaError, TypeError) as exc:
            return _graph_refusal(exc)
    reason = _migrate_carried.refusal(worker.executor)
    if reason:
        return reason
    for session in list(worker.sessions):
        reason = _migrate_state.process_refusal(session)
        if reason:
            return reason
    return _migrate_state.lease_refusal(lease)


def request(worker, target: dict | None) -> dict:
    """The answer to the pool server's request to move the lease to the receiving worker `target`; with no
    target, only whether it could leave (asked before the target admits it). MigrationRefused says why not."""
    if target is None:
        reason = refusal(worker)
        return {"ok": False, "error": reason} if reason else {"ok": True}
    return {"ok": True, **send(worker, target)}


def send(worker, target: dict, timeout: float = DRAIN_TIMEOUT_S) -> dict:
    """Send the lease to the receiving worker `target` ({"host", "port", "migrate_port", "local",
    "tls_sha256", "secret"}) and commit: the answer for the server, or MigrationRefused (the lease runs on
    here). Once committed, each connection is answered MOVED at its next frame that wants an answer
    (`Moved.frame`)."""
    reason = refusal(worker)
    if reason:
        raise MigrationRefused(reason)
    count = _migrate_stripes.wanted()
    where = f"{target['host']}:{target['migrate_port']}"

    def connected() -> _migrate_link.Link:
        return _migrate_link.connect(str(target["host"]), int(target["migrate_port"]), str(target["tls_sha256"]),
                                     str(target["secret"]).encode(), LINK_TIMEOUT_S)  # fmt: skip

    try:
        link = connected()
    except (OSError, _migrate_link.LinkError) as exc:
        raise MigrationRefused(f"the receiving worker at {where} cannot be reached: {_why(exc)}") from None
    stripes: list[_migrate_link.Link] = []  # the memory's connections beside this one (made before the pause)
    try:
        link.send({"stripes": count})
        for i in range(count if count > 1 else 0):
            stripes.append(connected())
            stripes[-1].send({"stripe": i})
        return _sent(worker, link, stripes or [link], target, where, timeout)
    except (OSError, _migrate_link.LinkError) as exc:
        link.close()
        raise MigrationRefused(f"the link to the receiving worker at {where} failed: {_why(exc)}") from None
    except CudaError as exc:
        link.close()
        raise MigrationRefused(f"reading the lease's memory failed: {exc}") from None
    except BaseException:
        link.close()
        raise
    finally:
        for stripe in stripes:  # after the answer: the receiving worker has read all of them
            stripe.close()
        worker.executor.end_thread()  # this thread's staging buffers (page-locked on a GPU)


def _sent(worker, link: _migrate_link.Link, stripes: list, target: dict, where: str, timeout: float) -> dict:
    asked = time.monotonic()
    committed = False
    try:
        _migrate._native_paused(worker, timeout)
        with worker.lease.gate.closed(timeout):
            paused = time.monotonic()
            reason = refusal(worker, graphs=False)  # a call just before the pause may have changed it
            if reason:
                raise MigrationRefused(reason)
            with _migrate._windows_held(worker.lease):
                for device in range(len(worker.devices)):
                    worker.executor.drain(device)
                for memory in list(worker.lease.windows):  # frees after streams: all reached now
                    memory._reclaim(wait=True)
                held = _migrate.mappings(worker.lease)
                manifest, tokens = _manifest(worker, held)
                manifest["carried"], pieces = _migrate_carried.exported(worker.executor)
                carried = sum(piece.size for piece in pieces)
                memory = manifest["memory"] + _migrate_carried.striped(manifest["carried"])
                total = sum(size for _, size, _ in memory) + carried
                parts = manifest["stripes"] = _migrate_stripes.plan(memory, len(stripes))
                link.send(manifest)
                try:
                    with _migrate_carried.device_contexts(
                        worker.executor, {device for _, _, device in memory}
                    ) as contexts:
                        _migrate_stripes.send(worker.executor.inner, stripes, parts, contexts)
                except (OSError, _migrate_link.LinkError):  # (a device read failing here is its own reason)
                    _said_why(link, where)  # the receiving worker's reason, where it gave one
                    raise
                link.send({"carried": carried}, carried)  # arrays, the program's own virtual memory
                _migrate_carried.send(pieces, link.send_bytes)
                answer = link.receive()
            if answer.get("ok") is not True:
                raise MigrationRefused(f"the receiving worker at {where} failed: {answer.get('error')}")
            link.send({"commit": True})
            if link.receive().get("committed") is not True:
                raise MigrationRefused(f"the receiving worker at {where} did not commit")
            committed = True
            worker.moved = Moved(link, target, tokens)
            resumed = time.monotonic()
    finally:
        if (
            worker.native is not None and not committed
        ):  # nothing moved: C serves again, its handles as they were
            worker.native.python_only(False)
    objects = int(answer.get("objects", 0))
    log.info("the lease moved to the receiving worker at %s: %d bytes at the same addresses (the memory over %d "
             "connection(s)), %d objects re-created, paused %.3f s; its processes reconnect there at their next "
             "call", where, total, len(stripes), objects, resumed - paused)  # fmt: skip
    return {"bytes": total, "objects": objects, "pause_s": round(resumed - paused, 6),
            "wait_s": round(paused - asked, 6), "stripes": len(stripes)}  # fmt: skip


def _said_why(link: _migrate_link.Link, where: str) -> None:
    """The memory did not all go: MigrationRefused with the receiving worker's reason if it answered one on the
    link within REASON_WAIT_S (a device write failing there, say), else nothing (the failure here stands)."""
    try:
        link.sock.settimeout(REASON_WAIT_S)
        answer = link.receive()
    except (OSError, _migrate_link.LinkError):
        return
    if answer.get("ok") is False:
        raise MigrationRefused(f"the receiving worker at {where} failed: {answer.get('error')}")


def _manifest(worker, held: list) -> tuple[dict, dict[int, int]]:
    """What the receiving worker re-creates: each process's windows, the memory mapped in them (in the order
    its bytes follow), the records its objects are made from (`Translated.exported`) and the guard's state
    (`_migrate_state.exported`); and each connection's token."""
    windows = [[w.base, w.size] for memory in list(worker.lease.windows)
               for w in [*memory.windows, *([memory.offered] if memory.offered is not None else [])]]  # fmt: skip
    # cuMemAddressReserve'd ranges outside the windows (none had room): the same addresses there too
    windows += [[base, size] for memory in list(worker.lease.windows)
                for base, (size, window) in memory.ranges.items() if window is None]  # fmt: skip
    try:
        objects = worker.executor.exported()
    except TypeError as exc:
        raise MigrationRefused(str(exc)) from None
    state, tokens = _migrate_state.exported(worker.lease, list(worker.sessions), held)
    manifest = {"lease": worker.lease_id, "devices": len(worker.devices), "windows": windows,
                "memory": [[m.base, m.size, m.device] for m in held], "objects": objects, "state": state,
                "graphs": _graphs(worker)}  # fmt: skip
    return manifest, tokens


def _graphs(worker) -> dict:
    """The lease's graphs and instantiated graphs (`Translated.graphs_exported`) and what the guard keeps of
    them (`_migrate_state.graphs_exported`)."""
    try:
        built = worker.executor.graphs_exported()
    except (CudaError, TypeError) as exc:
        raise MigrationRefused(_graph_refusal(exc)) from None
    return {"built": built, "guard": _migrate_state.graphs_exported(worker.lease)}


def _graph_refusal(exc: BaseException) -> str:
    return f"the lease holds a CUDA graph that a move to another server cannot re-create ({exc})"


# What the lease may hold that a move to another server does not carry yet (refused up front).
NOT_CARRIED = {
    "texref": "texture references (the legacy API)", "surfref": "surface references (the legacy API)",
    "link": "a link in progress (cuLinkCreate)",
}  # fmt: skip


def _not_carried(worker) -> list[str]:
    held = _migrate.holding(worker.lease)
    return [what for kind, what in NOT_CARRIED.items() if held.get(kind)]


class Moved:
    """The source's side once the lease moved: each connection, at its next frame, is told where the lease is
    (a frame that wants an answer: MOVED, which it did not run) or has the frame carried there (one that
    does not: it runs there before anything else of that process)."""

    def __init__(self, link: _migrate_link.Link, target: dict, tokens: dict[int, int]) -> None:
        self.link = link
        self.tokens = tokens
        self.lock = threading.Lock()  # one message at a time on the link
        self.where = f"{target['host']}:{target['port']}".encode()
        self.local = str(target.get("local", "")).encode()
        self.tls = str(target.get("tls_sha256", "")).encode()
        self.link_lost = False
        self.told: set[int] = set()  # processes answered MOVED: they resume there

    def frame(self, session, channel, call_id: int, flags: int, args: bytes, bulk_len: int) -> bool:
        """One frame of a connection after the move; False once the connection has been told (it ends)."""
        token = self.tokens.get(id(session), 0)
        bulk = channel.read_exact(bulk_len) if bulk_len else b""
        if not token:  # a process that connected after the move: it starts anew there (token 0: no state)
            if not flags & _wire.FLAG_WANTS_REPLY:
                return True  # (it made nothing here: what it sets up again there)
            outs = _wire.MOVED_TO.pack(0, self.where, self.local, self.tls)
            channel.send(_wire.REPLY.pack(_wire.MOVED, len(outs), 0), outs)
            return False
        try:
            with self.lock:
                if flags & _wire.FLAG_WANTS_REPLY:
                    self.link.send({"complete": token})
                else:
                    self.link.send({"frame": token, "call": call_id, "flags": flags,
                                    "args": base64.b64encode(args).decode()}, len(bulk))  # fmt: skip
                    if bulk:
                        self.link.send_bytes(bulk)
                    return True
        except (OSError, _migrate_link.LinkError) as exc:
            if not self.link_lost:
                log.warning("the link to the lease's new worker broke (%s): its processes' frames since the move "
                            "are lost", _why(exc))  # fmt: skip
                self.link_lost = True
        outs = _wire.MOVED_TO.pack(token, self.where, self.local, self.tls)
        self.told.add(token)
        channel.send(_wire.REPLY.pack(_wire.MOVED, len(outs), 0), outs)
        return False

    def closed(self, session) -> bool:
        """A connection ended (told, or its process gone): the new worker need not wait for more of it. Whether
        no moved process is left here (the link is then closed)."""
        token = self.tokens.pop(id(session), None)
        with self.lock:
            try:
                if token is not None and token not in self.told:  # it ended without coming: its state goes
                    self.link.send({"gone": token})
                if not self.tokens:
                    self.link.send({"done": True})
            except (OSError, _migrate_link.LinkError):
                pass
            if not self.tokens:
                self.link.close()
        return not self.tokens


def _why(exc: BaseException) -> str:
    return getattr(exc, "title", "") or str(exc) or type(exc).__name__


# -- the receiving end ---------------------------------------------------------------------------------


def receive(worker, listener: socket.socket, secret: bytes, wait_s: float) -> None:
    """In a thread of a receiving worker: wait `wait_s` for the sender, take the lease, and either hold it
    (committed: its processes reconnect here) or exit the process (its GPUs are free then)."""

    def run() -> None:
        link = _accepted(listener, _link_tls(worker), secret, time.monotonic() + wait_s)
        if link is None:
            _exit(f"no lease arrived within {wait_s:g} s")
        stripes: list[_migrate_link.Link] = []
        with link:
            try:
                try:
                    stripes = _stripes_accepted(listener, _link_tls(worker), secret, link)
                finally:
                    listener.close()
                parked, reason = _held(worker, link, stripes)
            except (OSError, _migrate_link.LinkError, MigrationRefused) as exc:
                parked, reason = None, f"the sending worker's link failed: {_why(exc)}"
            finally:
                for stripe in stripes:
                    if stripe is not link:  # the link itself goes on after the commit
                        stripe.close()
            if parked is None:
                _exit(reason)
            _carried(
                link,
                parked,
                lambda token: _migrate_state.discard(worker.lease, worker.executor, token, Session),
            )

    threading.Thread(target=run, name="gpupool-receive", daemon=True).start()


def _link_tls(worker) -> tuple:
    """The worker's TLS for the link's connections: Python's context, and its C context where there is one."""
    return worker.tls, getattr(worker, "native_tls", None)


def _accepted(
    listener: socket.socket, tls: tuple, secret: bytes, deadline: float
) -> _migrate_link.Link | None:
    """The next connection that proves the secret by `deadline` (None: none did); others are refused. `tls`:
    `_link_tls`."""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        listener.settimeout(left)
        try:
            sock, peer = listener.accept()
        except TimeoutError:
            continue
        try:
            link = _migrate_link.accept(sock, tls[0], secret, LINK_TIMEOUT_S, native_tls=tls[1])
            how = "TLS in C" if tls[0] and tls[1] else "TLS" if tls[0] else "plaintext, loopback"
            log.info("migration link connection from %s (%s)", peer[0], how)
            return link
        except (OSError, _migrate_link.LinkError) as exc:
            log.warning("migration link from %s refused: %s", peer[0], _why(exc))
            sock.close()


def _stripes_accepted(listener: socket.socket, tls: tuple, secret: bytes, link: _migrate_link.Link) -> list:
    """The connections the lease's memory comes over, in order: as many as the sender says it opens (each
    proving the secret and naming its place), or the link itself for one."""
    count = link.receive().get("stripes")
    if not isinstance(count, int) or not 1 <= count <= _migrate_stripes.MOST:
        raise MigrationRefused(f"the sender asks for {count!r} connections")
    if count == 1:
        return [link]
    stripes: dict[int, _migrate_link.Link] = {}
    deadline = time.monotonic() + _migrate_link.HANDSHAKE_TIMEOUT_S  # the sender opens them right away
    try:
        while len(stripes) < count:
            stripe = _accepted(listener, tls, secret, deadline)
            if stripe is None:
                raise MigrationRefused(f"{count - len(stripes)} of its {count} connections did not come")
            place = stripe.receive().get("stripe")
            if not isinstance(place, int) or not 0 <= place < count or place in stripes:
                stripe.close()
                raise MigrationRefused(f"a connection names place {place!r} of {count}")
            stripes[place] = stripe
    except BaseException:
        for stripe in stripes.values():
            stripe.close()
        raise
    return [stripes[i] for i in range(count)]


def _held(worker, link: _migrate_link.Link, stripes: list):
    """Take the manifest, the memory (over `stripes`), the objects and the processes' state; tell the sender;
    (the parked processes, "") once it committed, else (None, why this worker ends)."""
    manifest = link.receive()
    dies_after = int(os.environ.get(DIES_AFTER_ENV, "0") or 0)
    executor, got = worker.executor.inner, 0  # the memory is nobody's yet: no records, no handle map
    counting = threading.Lock()  # the stripes' threads count what landed
    contexts: dict[int, int] = {}  # device -> its primary context, current while its memory is copied
    backings = []
    try:
        for base, size in manifest["windows"]:
            at = executor.reserve_addresses(size, base)
            if at != base:
                executor.release_addresses(at, size)
                raise MigrationRefused(
                    f"device addresses [0x{base:x}, +{size}) are taken on this server's GPU"
                )
        carried = manifest.get("carried", {})
        memory = manifest["memory"] + _migrate_carried.striped(
            carried
        )  # the program's own virtual memory too
        for device in sorted({device for _, _, device in memory} | _migrate_carried.vm_devices(carried)):
            if not 0 <= device < len(worker.devices):
                raise MigrationRefused(f"the lease's memory names device {device}; this worker has "
                                       f"{len(worker.devices)}")  # fmt: skip
            # held until every stripe has ended: each sets it current
            contexts[device] = executor.cuDevicePrimaryCtxRetain(device)
        for base, size, device in manifest["memory"]:
            backings.append(executor.map_memory(base, size, device))
        vm = _migrate_carried.vm_mapped(executor, carried, contexts)

        def landed(n: int) -> None:
            nonlocal got
            with counting:
                got += n
                if dies_after and got >= dies_after:
                    os._exit(9)

        parts = _migrate_stripes.checked(manifest.get("stripes"), memory, len(stripes))
        _migrate_stripes.receive(executor, stripes, parts, contexts, landed)
        log.info("holding the lease's memory: %d bytes in %d range(s) at the addresses it had, over %d "
                 "connection(s)", got, len(memory), len(stripes))  # fmt: skip
        for device in contexts:  # the copies' references: the lease's own are the records'
            executor.cuDevicePrimaryCtxRelease(device)
        objects = worker.executor.imported(manifest["objects"])
        graphs = manifest.get("graphs") or {}  # before the guard's state: the native loop maps what it adds
        if graphs.get("built"):
            objects += worker.executor.graphs_imported(graphs["built"])
        parked = _migrate_state.imported(worker.lease, worker.executor, manifest["state"], manifest["memory"],
                                         backings, Allocation)  # fmt: skip
        _migrate_state.graphs_imported(worker.lease, graphs.get("guard") or {})
        # after the state: the lease's own contexts are known then, its arrays' and memory's copies run in them
        if "carried" not in link.receive():
            raise MigrationRefused("the carried objects' bytes did not follow the memory")
        objects += _migrate_carried.imported(worker.executor, carried, link.read_into, vm)
        log.info(
            "holding the lease's objects: %d re-created, the client's handle values mapped to them", objects
        )
    except Exception as exc:  # whatever it is, the sender hears why and the lease runs on at its source
        if not isinstance(exc, MigrationRefused):  # a driver error or a bug: which call, from where
            log.exception("re-creating the lease here failed")
        why = f"the lease could not be re-created here: {getattr(exc, 'title', '') or exc}"
        link.send({"ok": False, "error": why})
        return None, why
    link.send({"ok": True, "bytes": got, "objects": objects})
    decision = link.receive()
    if decision.get("commit") is not True:
        return None, str(decision.get("reason") or "the sender did not commit")
    link.send({"committed": True})
    log.info("the lease moved here: %d process(es) reconnect with their tokens", len(parked))
    return parked, ""


def _carried(link: _migrate_link.Link, parked: dict, discard) -> None:
    """After the commit: the frames each process sent the old worker after the pause, until it was told to
    come here (then its state is complete) or ended without being told (`discard(token)`: what it held here
    goes), or until the old worker is gone."""
    try:
        while True:
            message = link.receive()
            if "frame" in message:
                bulk = bytearray(link.bulk_left)
                if bulk:
                    link.read_into(memoryview(bulk))
                process = parked.get(int(message["frame"]))
                if process is not None:
                    process.frames.append((int(message["call"]), int(message["flags"]),
                                           base64.b64decode(message["args"]), bytes(bulk)))  # fmt: skip
            elif "complete" in message or "gone" in message:
                token = int(message.get("complete") or message.get("gone"))
                process = parked.get(token)
                if process is not None:
                    process.complete.set()
                if "gone" in message:  # ended before it was told: nothing of it will come here
                    log.info(
                        "a process of the moved lease ended before it reconnected: what it held here goes"
                    )
                    try:
                        discard(token)
                    except Exception:  # what stays is counted until the lease ends; the rest goes on
                        log.exception("freeing what a process of the moved lease held failed")
            elif message.get("done"):
                break
    except (OSError, _migrate_link.LinkError) as exc:
        log.warning(
            "the old worker's link ended (%s): processes not told yet resume with what arrived", _why(exc)
        )
    for process in parked.values():
        process.complete.set()


def _exit(reason: str) -> None:
    """The move will not complete here: the worker exits and its GPUs are free (its server sees it exit)."""
    log.warning("the lease did not move here (%s): exiting, its GPUs are free", reason)
    logging.shutdown()
    os._exit(0)
