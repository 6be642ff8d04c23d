"""Wall-clock deadlines for HTTP requests to a server under test (capplan.probe.endpoint).

A socket timeout bounds one read, so a server that trickles a byte a second never trips it; a
Deadline shuts the connection's socket when its time is up, which ends any blocked read, so
no request to a server outlives its deadline whatever the server sends.
"""

from __future__ import annotations

import http.client
import socket
import threading
from typing import Any


class Deadline:
    """A wall-clock deadline for one request: at expiry the socket is shut down, which ends
    any blocked read, so a server that trickles bytes cannot stretch a request past it.

    The socket is the one connect() opened, kept here (`attach`): http.client drops
    `conn.sock` once a response will close the connection (HTTP/1.0, `Connection: close`),
    and a deadline that read it back there found nothing to shut."""

    def __init__(self, seconds: float):
        self.expired = False
        self.sock: socket.socket | None = None
        self._lock = threading.Lock()
        self.timer = threading.Timer(seconds, self.expire)
        self.timer.daemon = True

    def attach(self, sock: socket.socket) -> None:
        with self._lock:
            self.sock = sock
            if self.expired:  # expired while connecting
                shut(sock)

    def expire(self) -> None:
        with self._lock:
            self.expired = True
            if self.sock is not None:
                shut(self.sock)

    def __enter__(self) -> Deadline:
        self.timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.timer.cancel()


def shut(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def connection(t: Any, timeout_s: float, deadline: Deadline) -> http.client.HTTPConnection:
    """An HTTP(S) connection whose connect() hands its socket to the deadline."""
    base = http.client.HTTPSConnection if t.https else http.client.HTTPConnection

    class _Kept(base):  # type: ignore[misc, valid-type]
        def connect(self) -> None:
            super().connect()
            deadline.attach(self.sock)

    return _Kept(t.host, t.port, timeout=timeout_s)


def get(t: Any, path: str, timeout_s: float, max_bytes: int) -> tuple[int, bytes] | None:
    """GET `path` of the target within `timeout_s` of wall-clock time: (status, at most
    `max_bytes` of the body), or None when the server cannot answer in time."""
    deadline = Deadline(timeout_s)
    conn = connection(t, timeout_s, deadline)
    try:
        with deadline:
            conn.request("GET", path)
            resp = conn.getresponse()
            return resp.status, resp.read(max_bytes)
    except (OSError, http.client.HTTPException):
        return None
    finally:
        conn.close()
