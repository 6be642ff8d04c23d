"""`calibrate --endpoint` against real HTTP servers on 127.0.0.1 (http.server in a thread).

The latency-law tests drive a clock the test controls: the server advances it by the law's
delay before each event and waits until the client has stamped that event, so the measured
TTFT and gaps are exact whatever the machine's load (no timed sleeps). The misbehaving-server
tests (issue 18) send each fault seen in the wild and check that it becomes an error for that
request, counted, never a thread traceback or a lost request.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from click.testing import CliRunner

from capplan.cli import cli
from capplan.probe.endpoint import MAX_EVENT_BYTES, parse_url, run_level

A_S, B_S, C_S, D_S = 0.080, 0.005, 0.010, 0.001
"""TTFT = A + B * level; every gap = C + D * level (on the test's clock)."""
REPO_ROOT = Path(__file__).resolve().parents[2]


class FakeClock:
    """The client's clock. The server advances it, writes one line, then waits until the
    client has read the clock again (it reads it once per line it receives)."""

    def __init__(self) -> None:
        self.t = 0.0
        self.reads = 0
        self.cv = threading.Condition()

    def __call__(self) -> float:
        with self.cv:
            self.reads += 1
            self.cv.notify_all()
            return self.t

    def step(self, dt: float, write) -> None:  # noqa: ANN001
        with self.cv:
            seen = self.reads
            self.t += dt
        write()
        with self.cv:
            assert self.cv.wait_for(lambda: self.reads > seen, timeout=10), "client stalled"


# Faults: mode -> the events the server sends after one good token.
BAD_EVENTS = {
    "tokens-abc": {"choices": [], "usage": {"completion_tokens": "abc"}},
    "tokens-list": {"choices": [], "usage": {"completion_tokens": [1]}},
    "tokens-negative": {"choices": [], "usage": {"completion_tokens": -5}},
    "tokens-over-max": {"choices": [], "usage": {"completion_tokens": 10**9}},
    "tokens-bool": {"choices": [], "usage": {"completion_tokens": True}},
    "usage-string": {"choices": [], "usage": "lots"},
    "choices-string": {"choices": "tok"},
    "choice-list": {"choices": [["tok"]]},
    "delta-string": {"choices": [{"index": 0, "delta": "tok"}]},
    "text-number": {"choices": [{"index": 0, "text": 7}]},
}
RAW_BAD_EVENTS = {  # not representable by json.dumps: Python's parser accepts them
    "tokens-nan": '{"choices": [], "usage": {"completion_tokens": NaN}}',
    "tokens-1e400": '{"choices": [], "usage": {"completion_tokens": 1e400}}',
}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # as uvicorn and other streaming servers do

    def log_message(self, *args: object) -> None:  # keep pytest output clean
        pass

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _event(self, payload: str, dt: float = 0.0) -> None:
        clock = self.server.clock  # type: ignore[attr-defined]
        if clock is None:
            if dt:
                time.sleep(dt)
            self._chunk(f"data: {payload}\n\n".encode())
        else:  # one line per write, so that one clock read acknowledges one event
            clock.step(dt, lambda: self._chunk(f"data: {payload}\n".encode()))

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        if self.server.mode == "serial":  # type: ignore[attr-defined] # one request at a time
            with self.server.serial_lock:  # type: ignore[attr-defined]
                self._post()
        else:
            self._post()

    def _post(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        srv = self.server
        srv.requests_seen.set()  # type: ignore[attr-defined]
        srv.bodies.append((self.path, body))  # type: ignore[attr-defined]
        mode, level = srv.mode, srv.level  # type: ignore[attr-defined]
        if mode == "http500":
            self.send_response(500)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if mode == "json":  # a server that ignores stream=true: one whole JSON answer
            data = json.dumps({"choices": [{"index": 0, "text": " tok" * body["max_tokens"]}],
                               "usage": {"completion_tokens": body["max_tokens"]}}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        if mode == "hang":
            time.sleep(30)
            return
        if mode == "trickle":  # one byte at a time, never a whole line: forever
            for _ in range(600):
                self._chunk(b"d")
                time.sleep(0.05)
            return
        if mode == "huge":  # one event line larger than the cap
            self._chunk(b"data: " + b"x" * (MAX_EVENT_BYTES + 10))
            return
        n = body["max_tokens"]
        if mode in ("pairs", "pairs-stop"):  # 2 tokens an event, no usage (audit defect 5)
            self._pairs(n, level, mode == "pairs-stop")
            return
        tok = json.dumps({"choices": [{"index": 0, "text": " tok"}]})
        self._event(tok, A_S + B_S * level)
        for i in range(1, n):
            if mode == "stall" and i == 2:
                time.sleep(5)
            if mode == "cut" and i == 3:
                self.wfile.write(b"0\r\n\r\n")
                self.close_connection = True
                return
            if mode == "malformed" and i == 1:
                self._event("{not json")
            if mode in BAD_EVENTS and i == 1:
                self._event(json.dumps(BAD_EVENTS[mode]))
            if mode in RAW_BAD_EVENTS and i == 1:
                self._event(RAW_BAD_EVENTS[mode])
            self._event(tok, C_S + D_S * level)
        self._event(json.dumps({"choices": [], "usage": {"completion_tokens": n}}))
        self._event("[DONE]")
        self.wfile.write(b"0\r\n\r\n")


    def _pairs(self, n: int, level: int, stop: bool) -> None:
        """n tokens in n / 2 events of two, no usage event; with `stop`, finish_reason stop
        on the last (a server that ended early, ignore_eos not honoured)."""
        for k in range(n // 2):
            choice = {"index": 0, "text": " tok tok"}
            if stop and k == n // 2 - 1:
                choice["finish_reason"] = "stop"
            self._event(json.dumps({"choices": [choice]}),
                        A_S + B_S * level if k == 0 else C_S + D_S * level)
        self._event("[DONE]")
        self.wfile.write(b"0\r\n\r\n")


class _Server(ThreadingHTTPServer):
    # socketserver's default listen backlog is 5; real servers (uvicorn: 2048) listen deeper.
    request_queue_size = 128


@pytest.fixture
def server() -> Iterator[ThreadingHTTPServer]:
    srv = _Server(("127.0.0.1", 0), _Handler)
    srv.daemon_threads = True
    srv.handle_error = lambda *a: None  # type: ignore[method-assign] # cut streams: quiet
    srv.level, srv.mode, srv.clock = 1, "ok", None  # type: ignore[attr-defined]
    srv.requests_seen = threading.Event()  # type: ignore[attr-defined]
    srv.serial_lock = threading.Lock()  # type: ignore[attr-defined] # mode "serial"
    srv.bodies = []  # type: ignore[attr-defined] # (path, request body) as received
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def _url(srv: ThreadingHTTPServer) -> str:
    return f"http://127.0.0.1:{srv.server_address[1]}"


@pytest.mark.parametrize("level", [1, 4, 8])
def test_measures_the_servers_latency_law_exactly(server: ThreadingHTTPServer, level: int
                                                  ) -> None:
    clock = FakeClock()
    server.clock, server.level = clock, level  # type: ignore[attr-defined]
    lv = run_level(parse_url(_url(server)), "m", 1, 3, input_len=32, output_len=6,
                   timeout_s=30, clock=clock)
    assert lv["errors"] == 0 and lv["completed"] == 3
    ttft, gap = A_S + B_S * level, C_S + D_S * level
    for q in ("mean", "p50", "p99"):
        assert lv["ttft_s"][q] == pytest.approx(ttft, rel=1e-9)
        assert lv["tbt_s"][q] == pytest.approx(gap, rel=1e-9)
    # E2E = TTFT + 5 gaps; TPOT = (E2E - TTFT) / (6 - 1) = the gap (vllm bench serve's defs)
    assert lv["e2e_s"]["mean"] == pytest.approx(ttft + 5 * gap, rel=1e-9)
    assert lv["tpot_s"]["mean"] == pytest.approx(gap, rel=1e-9)


def test_no_usage_counts_max_tokens_not_events(server: ThreadingHTTPServer) -> None:
    """Audit defect 5: 2 tokens an event and no usage counted 3 events as 3 tokens.
    By hand, on the test's clock at level 1: 6 tokens in 3 events; TTFT = A + B = 85 ms,
    E2E = TTFT + 2 event gaps of C + D = 85 + 22 = 107 ms; TPOT = (E2E - TTFT) / (6 - 1)
    = 22 / 5 = 4.4 ms (before: 22 / 2 = 11 ms, the event gap)."""
    clock = FakeClock()
    server.clock, server.mode = clock, "pairs"  # type: ignore[attr-defined]
    lv = run_level(parse_url(_url(server)), "m", 1, 2, input_len=32, output_len=6,
                   timeout_s=30, clock=clock)
    assert lv["completed"] == 2 and lv["errors"] == 0
    assert lv["tpot_s"]["mean"] == pytest.approx(0.022 / 5, rel=1e-9)
    assert lv["e2e_s"]["mean"] == pytest.approx(0.107, rel=1e-9)
    assert lv["output_tokens_from"] == {"max_tokens": 2} and "warnings" not in lv


def test_no_usage_and_an_early_stop_counts_events_and_warns(server: ThreadingHTTPServer,
                                                            run_cli) -> None:
    """A server that stops early (finish_reason stop) without usage: the tokens are not known,
    so they are counted per event, and the level says so (a warning on stderr)."""
    server.mode = "pairs-stop"  # type: ignore[attr-defined]
    r = run_cli("calibrate", "--endpoint", _url(server), "--model", "m", "--concurrency", "1",
                "--output-len", "6", "--requests-per-level", "2", "--format", "json")
    assert r.exit_code == 0, r.stderr
    lv = json.loads(r.stdout)["levels"][0]
    assert lv["output_tokens_from"] == {"events": 2}
    assert "warning: concurrency 1: 2 of 2 requests sent no usage" in r.stderr


def test_cli_json_levels_and_fit(server: ThreadingHTTPServer) -> None:
    r = CliRunner().invoke(cli, ["calibrate", "--endpoint", _url(server), "--model", "m",
                                 "--concurrency", "1,2", "--output-len", "6",
                                 "--requests-per-level", "2", "--format", "json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert [lv["concurrency"] for lv in out["levels"]] == [1, 2]
    for lv in out["levels"]:
        assert set(lv["ttft_s"]) == {"mean", "p50", "p90", "p99"}
        assert lv["completed"] == 2 and lv["errors"] == 0
    assert out["fit"]["tbt_law"]["intercept_s"] > 0


def test_refused_connection_is_one_line_exit_2() -> None:
    with socket.socket() as s:  # bound, never listening: connections are refused, and the
        s.bind(("127.0.0.1", 0))  # port stays ours (closed, another test's server may take it)
        port = s.getsockname()[1]
        r = CliRunner().invoke(cli, ["calibrate", "--endpoint", f"http://127.0.0.1:{port}",
                                     "--model", "m"])
    assert r.exit_code == 2
    assert "cannot connect" in r.output and len(r.output.strip().splitlines()) == 1


@pytest.mark.parametrize("url", ["http://127.0.0.1:abc", "http://127.0.0.1:99999",
                                 "http://127.0.0.1:-1", "http://[::1", "http://[zz::1]:80",
                                 "http://127.0.0.1:0", "ftp://host"])
def test_bad_endpoint_url_is_one_line_exit_2(run_cli, url: str) -> None:
    r = run_cli("calibrate", "--endpoint", url, "--model", "m", "--timeout", "1")
    assert r.exit_code == 2 and r.exception is None, (r.stderr, r.exception)
    assert len(r.stderr_lines) == 1 and r.stderr.startswith("Error: "), r.stderr


def test_stall_times_out_and_is_counted(server: ThreadingHTTPServer) -> None:
    server.mode = "stall"  # type: ignore[attr-defined]
    lv = run_level(parse_url(_url(server)), "m", 2, 2, 16, 6, timeout_s=0.5)
    assert lv["errors"] == 2 and lv["completed"] == 0
    assert any("timeout" in k for k in lv["error_kinds"])


def test_trickling_server_cannot_extend_the_deadline(server: ThreadingHTTPServer) -> None:
    server.mode = "trickle"  # type: ignore[attr-defined]
    t0 = time.monotonic()
    lv = run_level(parse_url(_url(server)), "m", 1, 1, 16, 6, timeout_s=0.5)
    took = time.monotonic() - t0
    assert lv["errors"] == 1 and lv["error_kinds"] == {"timeout after 0.5 s": 1}
    assert took < 3.0, took  # 30 s of trickle before the fix


def test_one_huge_event_is_an_error_not_a_memory_sink(server: ThreadingHTTPServer) -> None:
    server.mode = "huge"  # type: ignore[attr-defined]
    lv = run_level(parse_url(_url(server)), "m", 1, 1, 16, 6, timeout_s=10)
    assert lv["errors"] == 1
    assert list(lv["error_kinds"]) == [f"an event exceeds {MAX_EVENT_BYTES // 1024} KiB"]


def test_a_server_that_does_not_stream_is_named(server: ThreadingHTTPServer, run_cli) -> None:
    """Audit defect 15: a 200 answer with Content-Type application/json (stream=true ignored)
    was reported as "stream ended before [DONE]"."""
    server.mode = "json"  # type: ignore[attr-defined]
    r = run_cli("calibrate", "--endpoint", _url(server), "--model", "m", "--concurrency", "1",
                "--output-len", "6", "--requests-per-level", "3")
    assert r.exit_code == 2 and len(r.stderr_lines) == 1, r.stderr
    assert ("every request failed (the server did not stream (Content-Type application/json) "
            "x3)") in r.stderr


def test_one_token_outputs_say_there_is_no_gap_to_fit(server: ThreadingHTTPServer,
                                                       run_cli) -> None:
    """Audit defect 14: --output-len 1 completed every request and said "no level completed a
    request"; one token has no gap after it."""
    r = run_cli("calibrate", "--endpoint", _url(server), "--model", "m", "--concurrency", "1",
                "--output-len", "1", "--requests-per-level", "2")
    assert r.exit_code == 0, r.stderr
    assert "no level completed a request" not in r.stdout
    assert "no level has a token gap to fit TBT from" in r.stdout


def test_out_with_one_token_outputs_is_refused_before_the_run(server: ThreadingHTTPServer,
                                                              run_cli, tmp_path) -> None:
    """Review finding 7: --out with --output-len 1 ran the benchmark, then said "needs --gpu G
    and a catalog --model" with both given. The cause (no token gap) is said before any
    request is sent; results files without a gap say the same cause."""
    out = tmp_path / "one.yaml"
    r = run_cli("calibrate", "--endpoint", _url(server), "--model", "llama-3.1-8b",
                "--served-model", "x", "--gpu", "h100-sxm", "--output-len", "1",
                "--concurrency", "1", "--requests-per-level", "2", "--out", str(out))
    assert r.exit_code == 2 and len(r.stderr_lines) == 1, r.stderr
    assert "--output-len 1 gives each request one token, no gap" in r.stderr
    assert not server.bodies and not out.exists()  # type: ignore[attr-defined]
    from capplan.errors import InputError
    from capplan.probe.results import fit_levels, write_levels_calibration

    level = {"concurrency": 1, "completed": 2, "ttft_s": {"mean": 0.1}, "tbt_s": {}}
    fit = fit_levels([level], "llama-3.1-8b", "h100-sxm")
    with pytest.raises(InputError, match="no level has a token gap to fit TBT from"):
        write_levels_calibration(out, [level], fit)


def test_served_model_is_sent_and_model_is_fitted(server: ThreadingHTTPServer, run_cli,
                                                  tmp_path) -> None:
    """Audit defect 13: a server launched with --served-model-name my-llama could not be
    fitted (--model was both the name sent and the catalog model). --served-model is sent;
    --model is the catalog model the fit and the file use."""
    import yaml

    out = tmp_path / "cal.yaml"
    r = run_cli("calibrate", "--endpoint", _url(server), "--model", "llama-3.1-8b",
                "--served-model", "my-llama", "--gpu", "h100-sxm", "--concurrency", "1,2",
                "--output-len", "6", "--requests-per-level", "2", "--out", str(out))
    assert r.exit_code == 0, r.stderr
    assert {b["model"] for _p, b in server.bodies} == {"my-llama"}  # type: ignore[attr-defined]
    assert yaml.safe_load(out.read_text())["measured"]["model"] == "llama-3.1-8b"
    r = run_cli("calibrate", "--device", "cpu", "--served-model", "my-llama")
    assert r.exit_code == 2 and "--served-model goes with --endpoint" in r.stderr


def test_http_error_is_counted(server: ThreadingHTTPServer) -> None:
    server.mode = "http500"  # type: ignore[attr-defined]
    lv = run_level(parse_url(_url(server)), "m", 2, 3, 16, 6, timeout_s=5)
    assert lv["errors"] == 3 and lv["error_kinds"] == {"HTTP 500": 3}


def test_cut_stream_counted_partial_results_kept(server: ThreadingHTTPServer) -> None:
    t = parse_url(_url(server))
    good = run_level(t, "m", 1, 2, 16, 4, timeout_s=5)
    server.mode = "cut"  # type: ignore[attr-defined]
    bad = run_level(t, "m", 1, 2, 16, 6, timeout_s=5)
    assert good["completed"] == 2 and good["errors"] == 0
    assert bad["errors"] == 2 and "stream ended before [DONE]" in bad["error_kinds"]


def test_malformed_events_counted_request_kept(server: ThreadingHTTPServer) -> None:
    server.mode = "malformed"  # type: ignore[attr-defined]
    lv = run_level(parse_url(_url(server)), "m", 1, 2, 16, 4, timeout_s=5)
    assert lv["completed"] == 2 and lv["malformed_events"] == 2


@pytest.mark.parametrize("mode", [*BAD_EVENTS, *RAW_BAD_EVENTS])
def test_bad_field_is_an_error_for_that_request(server: ThreadingHTTPServer, mode: str,
                                                capfd: pytest.CaptureFixture[str]) -> None:
    """Before: a worker thread died with a traceback and the level said `done 0, errors 0`;
    a negative token count gave a negative output tok/s."""
    server.mode = mode  # type: ignore[attr-defined]
    lv = run_level(parse_url(_url(server)), "m", 2, 3, 16, 4, timeout_s=5)
    assert lv["completed"] + lv["errors"] == 3
    assert lv["errors"] == 3, lv["error_kinds"]
    assert all(k.startswith("bad event: ") for k in lv["error_kinds"]), lv["error_kinds"]
    assert lv["output_tokens_per_s"] == 0.0
    assert "Traceback" not in capfd.readouterr().err


def _interactive_sigint() -> None:
    """The child starts with SIGINT at its default, as from an interactive shell. A suite run as a
    background job of a script inherits SIGINT ignored, and a Python started so keeps ignoring
    it (as it should: `capplan ... &` in a script is not for Ctrl-C), which is not this test."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_stops_the_run_exits_130_and_keeps_out(server: ThreadingHTTPServer,
                                                      tmp_path: Path) -> None:
    """Before: Ctrl-C cut one level, the run went on, exited 0 and overwrote --out."""
    server.mode = "hang"  # type: ignore[attr-defined]
    out = tmp_path / "cal.yaml"
    out.write_text("original: true\n")
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "capplan", "calibrate", "--endpoint", _url(server), "--model",
         "llama-3.1-8b", "--gpu", "h100-sxm", "--concurrency", "1,2", "--requests-per-level",
         "1", "--out", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path,
        preexec_fn=_interactive_sigint)
    try:
        assert server.requests_seen.wait(30)  # type: ignore[attr-defined]
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=20)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 130, (stdout, stderr)
    assert "interrupted" in stderr and "Traceback" not in stderr
    assert out.read_text() == "original: true\n"
    assert not list(tmp_path.glob(".cal.yaml*"))  # no temp file left
