"""`calibrate --endpoint` against real HTTP servers on 127.0.0.1 (http.server in a thread)."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from click.testing import CliRunner

from capplan.cli import cli
from capplan.probe.endpoint import parse_url, run_level

A_S, B_S, C_S, D_S = 0.080, 0.005, 0.010, 0.001
"""TTFT = A + B * concurrency; every gap = C + D * concurrency (times the server's `scale`)."""
LAW_SCALE = 5.0
"""The law-recovery test stretches the law 5x (TTFT 425-600 ms, gaps 55-90 ms) so that thread
scheduling noise on a loaded 2-core CI machine stays inside the 10% tolerance: measured on 2
cores, a request's TTFT runs 5-20 ms late beside two busy processes and up to ~40 ms beside
four (the 1x law's 8.5 ms tolerance failed 5 runs in 6 beside two). The other tests keep the
fast 1x law."""


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # as uvicorn and other streaming servers do

    def log_message(self, *args: object) -> None:  # keep pytest output clean
        pass

    def _event(self, payload: str) -> None:
        data = f"data: {payload}\n\n".encode()
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        srv = self.server
        conc = srv.level  # type: ignore[attr-defined]
        mode = srv.mode  # type: ignore[attr-defined]
        k = srv.scale  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        time.sleep(k * (A_S + B_S * conc))
        n = body["max_tokens"]
        for i in range(n):
            if i:
                time.sleep(k * (C_S + D_S * conc))
            if mode == "stall" and i == 2:
                time.sleep(5)
            if mode == "cut" and i == 3:
                self.wfile.write(b"0\r\n\r\n")
                self.close_connection = True
                return
            if mode == "malformed" and i == 1:
                self._event("{not json")
            self._event(json.dumps({"choices": [{"index": 0, "text": " tok"}]}))
        self._event(json.dumps({"choices": [], "usage": {"completion_tokens": n}}))
        self._event("[DONE]")
        self.wfile.write(b"0\r\n\r\n")


class _Server(ThreadingHTTPServer):
    # socketserver's default listen backlog is 5: with 8 clients connecting at once on a busy
    # machine, the accept thread falls behind, the kernel drops the extra SYNs and the client
    # retransmits after its 1 s initial RTO -- one request ~1 s late, +60 ms on a level's mean
    # TTFT. Real servers (uvicorn: 2048) listen with a deep backlog.
    request_queue_size = 128


@pytest.fixture
def server() -> Iterator[ThreadingHTTPServer]:
    srv = _Server(("127.0.0.1", 0), _Handler)
    srv.daemon_threads = True
    srv.handle_error = lambda *a: None  # type: ignore[method-assign] # cut streams: quiet
    srv.level, srv.mode, srv.scale = 1, "ok", 1.0  # type: ignore[attr-defined]
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def _url(srv: ThreadingHTTPServer) -> str:
    return f"http://127.0.0.1:{srv.server_address[1]}"


def test_recovers_latency_law_at_each_level(server: ThreadingHTTPServer) -> None:
    t = parse_url(_url(server))
    server.scale = LAW_SCALE  # type: ignore[attr-defined]
    for conc in (1, 4, 8):
        server.level = conc  # type: ignore[attr-defined]
        lv = run_level(t, "m", conc, 2 * conc, input_len=32, output_len=6, timeout_s=10)
        assert lv["errors"] == 0 and lv["completed"] == 2 * conc
        assert lv["ttft_s"]["mean"] == pytest.approx(LAW_SCALE * (A_S + B_S * conc), rel=0.10)
        assert lv["tbt_s"]["p50"] == pytest.approx(LAW_SCALE * (C_S + D_S * conc), rel=0.10)
        assert lv["output_tokens_per_s"] > 0 and lv["requests_per_s"] > 0


def test_cli_json_levels_and_fit(server: ThreadingHTTPServer) -> None:
    r = CliRunner().invoke(cli, ["calibrate", "--endpoint", _url(server), "--model", "m",
                                 "--concurrency", "1,2", "--output-len", "6",
                                 "--requests-per-level", "2", "--format", "json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert [lv["concurrency"] for lv in out["levels"]] == [1, 2]
    for lv in out["levels"]:
        assert set(lv["ttft_s"]) == {"mean", "p50", "p90", "p99"}
    assert out["fit"]["tbt_law"]["intercept_s"] > 0


def test_refused_connection_is_one_line_exit_2() -> None:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    r = CliRunner().invoke(cli, ["calibrate", "--endpoint", f"http://127.0.0.1:{port}",
                                 "--model", "m"])
    assert r.exit_code == 2
    assert "cannot connect" in r.output and len(r.output.strip().splitlines()) == 1


def test_stall_times_out_and_is_counted(server: ThreadingHTTPServer) -> None:
    server.mode = "stall"  # type: ignore[attr-defined]
    lv = run_level(parse_url(_url(server)), "m", 2, 2, 16, 6, timeout_s=0.5)
    assert lv["errors"] == 2 and lv["completed"] == 0
    assert any("timeout" in k for k in lv["error_kinds"])


def test_cut_stream_counted_partial_results_kept(server: ThreadingHTTPServer) -> None:
    t = parse_url(_url(server))
    server.level = 1  # type: ignore[attr-defined]
    good = run_level(t, "m", 1, 2, 16, 4, timeout_s=5)
    server.mode = "cut"  # type: ignore[attr-defined]
    bad = run_level(t, "m", 1, 2, 16, 6, timeout_s=5)
    assert good["completed"] == 2 and good["errors"] == 0
    assert bad["errors"] == 2 and "stream ended before [DONE]" in bad["error_kinds"]


def test_malformed_events_counted_request_kept(server: ThreadingHTTPServer) -> None:
    server.mode = "malformed"  # type: ignore[attr-defined]
    lv = run_level(parse_url(_url(server)), "m", 1, 2, 16, 4, timeout_s=5)
    assert lv["completed"] == 2 and lv["malformed_events"] == 2
