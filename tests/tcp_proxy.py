"""A TCP proxy on loopback for the tests: forwards each connection both ways, keeps every byte it saw
(to check what crosses the network), and can be cut and healed (a network partition)."""

from __future__ import annotations

import contextlib
import socket
import threading


class TcpProxy:
    def __init__(self, host: str, port: int) -> None:
        self.target = (host, int(port))
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.endpoint = f"127.0.0.1:{self.port}"
        self.to_target = bytearray()  # what clients sent
        self.to_client = bytearray()  # what the target answered
        self.cut = False
        self.socks: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            if self.cut:
                conn.close()
                continue
            try:
                up = socket.create_connection(self.target, timeout=2)
            except OSError:
                conn.close()
                continue
            up.settimeout(None)
            self.socks += [conn, up]
            for src, dst, record in ((conn, up, self.to_target), (up, conn, self.to_client)):
                threading.Thread(target=self._pump, args=(src, dst, record), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket, record: bytearray) -> None:
        try:
            while data := src.recv(65536):
                record += data
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def partition(self) -> None:
        """Cut every connection and refuse new ones until heal()."""
        self.cut = True
        for s in self.socks:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
        self.socks.clear()

    def heal(self) -> None:
        self.cut = False

    def close(self) -> None:
        self.listener.close()
