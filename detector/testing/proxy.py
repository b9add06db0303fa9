"""A loopback TCP proxy that a test can cut and restore: a network partition between one client
and a server, with everything else left reachable.

`cut()` closes every connection through the proxy and refuses new ones (accepted, then closed at
once), so the client's next call fails as a partition does once TCP gives up; `restore()` lets
new connections through again. Threads only: nothing here needs an event loop.
"""

from __future__ import annotations

import contextlib
import socket
import threading

from detector.closing import Closing


class TcpProxy(Closing):
    """Forwards 127.0.0.1:`port` to `target`."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self._target = (target_host, target_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._cut = False
        self._closed = False
        self._acceptor = threading.Thread(target=self._accept, name="tcp-proxy", daemon=True)
        self._acceptor.start()

    def cut(self) -> None:
        with self._lock:
            self._cut = True
            self._drop_all()

    def restore(self) -> None:
        with self._lock:
            self._cut = False

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._drop_all()
        self._listener.close()

    def _drop_all(self) -> None:
        for sock in self._open:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        self._open.clear()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            with self._lock:
                refused = self._cut or self._closed
            if refused:
                client.close()
                continue
            try:
                server = socket.create_connection(self._target, timeout=5)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            with self._lock:
                if self._cut or self._closed:
                    client.close()
                    server.close()
                    continue
                self._open.update((client, server))
            for src, dst in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            with self._lock:
                for sock in (src, dst):
                    if sock in self._open:
                        self._open.discard(sock)
                        with contextlib.suppress(OSError):
                            sock.shutdown(socket.SHUT_RDWR)
                        sock.close()
