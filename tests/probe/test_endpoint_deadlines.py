"""Deadlines of `calibrate --endpoint` against every framing a trickling server may use.

A raw-socket server on 127.0.0.1 answers with one token event, then trickles a byte every
50 ms forever, framed as HTTP/1.0 (close-delimited), HTTP/1.1 `Connection: close`, HTTP/1.1
keep-alive with a Content-Length it never reaches, or HTTP/1.1 chunked. Before the fix the
HTTP/1.0 and `Connection: close` cases ran past the deadline: http.client drops `conn.sock`
once a response will close, and the deadline found no socket to shut.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from capplan.cli import cli
from capplan.probe.endpoint import LevelDeadline, parse_url, run_level

TOKEN = b"data: " + json.dumps({"choices": [{"text": " tok"}]}).encode() + b"\n\n"
FRAMINGS = {
    "http10": b"HTTP/1.0 200 OK\r\nContent-Type: text/event-stream\r\n\r\n",
    "close": b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n",
    "keepalive": b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                 b"Content-Length: 100000000\r\n\r\n",
    "chunked": b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
               b"Transfer-Encoding: chunked\r\n\r\n",
}


class TrickleServer:
    """Accepts connections; each gets a header in the framing, one token event, a trickle."""

    def __init__(self, framing: str, events: list[bytes] | None = None):
        self.framing, self.events = framing, events
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.stop = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _send(self, conn: socket.socket, data: bytes) -> None:
        if self.framing == "chunked":
            data = f"{len(data):x}\r\n".encode() + data + b"\r\n"
        conn.sendall(data)

    @staticmethod
    def _read_body(conn: socket.socket, buf: bytes) -> None:
        """Reads the request body: closing with it unread makes the kernel send a reset,
        which can reach the client before the scripted events it should read."""
        head, _, body = buf.partition(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":", 1)[1])
        while len(body) < length:
            chunk = conn.recv(65536)
            if not chunk:
                return
            body += chunk

    def _handle(self, conn: socket.socket) -> None:
        try:
            conn.settimeout(5)
            buf = b""
            while b"\r\n\r\n" not in buf:
                chunk = conn.recv(65536)
                if not chunk:  # the client gave up mid-request: before, a busy loop on EOF
                    return
                buf += chunk
            self._read_body(conn, buf)
            conn.sendall(FRAMINGS[self.framing])
            if self.events is not None:  # a scripted stream, then close
                for e in self.events:
                    self._send(conn, e)
                if self.framing == "chunked":
                    conn.sendall(b"0\r\n\r\n")
                return
            self._send(conn, TOKEN)
            while not self.stop.is_set():
                self._send(conn, b"d")
                time.sleep(0.05)
        except OSError:
            pass
        finally:
            conn.close()

    def close(self) -> None:
        self.stop.set()
        self.sock.close()


@pytest.fixture(params=list(FRAMINGS))
def trickle(request: pytest.FixtureRequest) -> Iterator[TrickleServer]:
    srv = TrickleServer(request.param)
    yield srv
    srv.close()


def test_request_deadline_holds_on_every_framing(trickle: TrickleServer) -> None:
    t0 = time.monotonic()
    lv = run_level(parse_url(trickle.url), "m", 1, 2, 8, 4, timeout_s=0.3)
    took = time.monotonic() - t0
    assert lv["errors"] == 2 and lv["error_kinds"] == {"timeout after 0.3 s": 2}
    assert lv["first_error"] == "timeout after 0.3 s"
    assert took < 2 * (0.3 + 1.0), took  # two requests in turn: timeout + 1 s each at most


def test_cli_ends_within_timeout_with_one_line_and_keeps_out(tmp_path: Path) -> None:
    srv = TrickleServer("http10")
    out = tmp_path / "cal.yaml"
    out.write_text("original: true\n")
    try:
        t0 = time.monotonic()
        r = CliRunner().invoke(cli, [
            "calibrate", "--endpoint", srv.url, "--model", "llama-3.1-8b", "--gpu", "h100-sxm",
            "--concurrency", "1", "--requests-per-level", "2", "--input-len", "8",
            "--output-len", "4", "--timeout", "0.5", "--out", str(out)])
        took = time.monotonic() - t0
    finally:
        srv.close()
    assert took < 2 * 1.5, took
    assert r.exit_code == 2, r.output
    assert "every request failed (timeout after 0.5 s x2)" in r.output
    assert out.read_text() == "original: true\n"


def test_level_deadline_stops_new_requests_and_shuts_those_in_flight() -> None:
    level = LevelDeadline(timeout_s=0.2, num_requests=3, concurrency=1)
    assert level.seconds == pytest.approx(0.2 * 3 + LevelDeadline.SLACK_S)
    level.expire()
    srv = TrickleServer("chunked")
    try:  # a level whose deadline passed sends nothing more
        from capplan.probe.endpoint import one_request

        r = one_request(parse_url(srv.url), "m", "x", 4, 5.0, level=level)
    finally:
        srv.close()
    assert not r.ok and r.error.startswith("level deadline")


@pytest.mark.parametrize("framing", ["http10", "chunked"])
def test_token_events_beyond_max_tokens_are_an_error(framing: str) -> None:
    """Before: 12 text events for max_tokens 4 counted as 12 tokens (output tok/s 113,802)."""
    srv = TrickleServer(framing, [TOKEN] * 12 + [b"data: [DONE]\n\n"])
    try:
        lv = run_level(parse_url(srv.url), "m", 1, 1, 8, 4, timeout_s=5)
    finally:
        srv.close()
    assert lv["errors"] == 1 and lv["output_tokens_per_s"] == 0.0
    assert lv["first_error"] == "bad event: more token events than max_tokens 4"


@pytest.mark.parametrize("fmt", ["table", "csv", "markdown", "json"])
def test_first_error_is_said_in_every_format(fmt: str) -> None:
    body = [TOKEN, b'data: {"error": "model m does not exist"}\n\n']
    srv = TrickleServer("http10", body)
    try:
        r = CliRunner().invoke(cli, [
            "calibrate", "--endpoint", srv.url, "--model", "m", "--concurrency", "1",
            "--requests-per-level", "1", "--output-len", "4", "--timeout", "5",
            "--format", fmt])
    finally:
        srv.close()
    assert "server error: model m does not exist" in r.output, r.output


@pytest.mark.parametrize("args, says", [
    ([], "needs --gpu G"),
    (["--gpu", "h100-sxm", "--out", "missing/cal.yaml"], "does not exist"),
])
def test_out_is_checked_before_any_request(args: list[str], says: str, tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: the benchmark ran, then --out failed and the measurements were dropped."""
    monkeypatch.chdir(tmp_path)
    srv = TrickleServer("http10")
    try:
        r = CliRunner().invoke(cli, [
            "calibrate", "--endpoint", srv.url, "--model", "llama-3.1-8b", "--timeout", "30",
            *(args or ["--out", "cal.yaml"])])
    finally:
        srv.close()
    assert r.exit_code == 2 and says in r.output, r.output


def test_side_requests_do_not_stretch_the_levels(tmp_path: Path) -> None:
    """The /metrics and /get_server_info side requests had --timeout as their deadline, asked
    three times a level: a trickling server made one request's level last 4 x --timeout."""
    srv = TrickleServer("close")
    try:
        t0 = time.monotonic()
        r = CliRunner().invoke(cli, [
            "calibrate", "--endpoint", srv.url, "--model", "m", "--concurrency", "1,1",
            "--requests-per-level", "1", "--output-len", "4", "--timeout", "0.6"])
        took = time.monotonic() - t0
    finally:
        srv.close()
    assert r.exit_code == 2 and "every request failed (timeout after 0.6 s x2)" in r.output
    assert took < 2 * (0.6 + 1.0), took  # two requests: --timeout + 1 s each (before: 4.8 s)
