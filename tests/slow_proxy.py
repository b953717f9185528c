"""A TCP proxy on loopback that makes a server slow: each request waits ``delay_s``
before it is forwarded. In front of the S3 test server it is a store that takes
200 ms a call, over the real wire protocol — what a distant or overloaded MinIO looks
like to the job."""

from __future__ import annotations

import socket
import threading
import time


class SlowProxy:
    """Listens on 127.0.0.1 and forwards every connection to ``upstream``
    (``host:port``); the first bytes of each request (what the client sends after
    the server last answered) wait ``delay_s``."""

    def __init__(self, upstream: str, delay_s: float) -> None:
        host, port = upstream.rsplit(":", 1)
        self.upstream = (host, int(port))
        self.delay_s = delay_s
        self.requests = 0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self._closed = False
        threading.Thread(target=self._accept, daemon=True, name="slow-proxy").start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.upstream)
            turn = {"request": True}  # the next client bytes start a request
            threading.Thread(target=self._pump, args=(client, server, turn, True),
                             daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, turn, False),
                             daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, turn: dict,
              requests: bool) -> None:
        try:
            while data := src.recv(65536):
                if requests and turn["request"]:
                    turn["request"] = False
                    self.requests += 1
                    time.sleep(self.delay_s)
                elif not requests:
                    turn["request"] = True
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self._closed = True
        self._listener.close()
