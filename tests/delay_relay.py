"""A TCP relay that holds every segment it forwards for a fixed time, in each direction: the link's
one-way delay where the kernel has no `sch_netem` and the link is shaped by rate alone (tbf).
tests/netem_link.py starts it in the worker's namespace (`NetemLink.reach`), so latency is part of
what a run across the link measures, not only bandwidth.

    python tests/delay_relay.py LISTEN_HOST TARGET_HOST TARGET_PORT DELAY_NS

prints the port it listens on (one line), then relays every connection to TARGET until killed. Each
direction of a connection is a process of its own: a segment read at time t is sent at t + DELAY_NS (the
process spins for the rest, so the delay is not a timer's granularity); while it waits, what follows
queues in the socket, as behind a link's delay. Processes, not threads: a thread spinning out one
segment's delay held the interpreter's lock while the other direction's segment waited for it (up to the
switch interval each way, more than the delay itself), which made a training across the link pay the
relay, not the link. Small segments still pay a process's wake-up: the measured round trip says what a
run got.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import time

CHUNK = 1 << 20  # at most this much per read: a bulk copy moves in large segments, each held once


def pump(source: socket.socket, sink: socket.socket, delay_ns: int) -> None:
    """Forward what `source` sends to `sink`, each segment `delay_ns` after it arrived."""
    buffer = bytearray(CHUNK)
    view = memoryview(buffer)
    try:
        while n := source.recv_into(buffer):
            due = time.perf_counter_ns() + delay_ns
            while time.perf_counter_ns() < due:
                pass
            sink.sendall(view[:n])
    except OSError:
        pass  # either side gone: the other is closed below
    finally:
        for sock, how in ((sink, socket.SHUT_WR), (source, socket.SHUT_RD)):
            with contextlib.suppress(OSError):
                sock.shutdown(how)


def serve(listener: socket.socket, target: tuple[str, int], delay_ns: int) -> None:
    while True:
        client, _ = listener.accept()
        try:
            server = socket.create_connection(target)
        except OSError:
            client.close()
            continue
        for sock in (client, server):  # a held segment must not wait again for Nagle
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for source, sink in ((client, server), (server, client)):
            if os.fork() == 0:  # the direction's process: ends with the connection
                listener.close()
                pump(source, sink, delay_ns)
                os._exit(0)
        client.close()  # the directions' processes hold the connection now
        server.close()


def main(argv: list[str]) -> int:
    if len(argv) != 4:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    listen_host, target_host, target_port, delay_ns = argv[0], argv[1], int(argv[2]), int(argv[3])
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # a direction's process that ended is reaped at once
    listener = socket.create_server((listen_host, 0), backlog=64)
    print(listener.getsockname()[1], flush=True)
    serve(listener, (target_host, target_port), delay_ns)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
