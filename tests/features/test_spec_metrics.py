"""A server's spec-decode counters -> the acceptance length a calibration carries."""

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

import capplan
from capplan.models.calibration import default_calibration
from capplan.probe import spec_metrics
from capplan.probe.endpoint import parse_url

SAMPLE = """# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{{engine="0",model_name="m"}} {drafts}
vllm:spec_decode_num_draft_tokens_total{{engine="0",model_name="m"}} {draft_tokens}
vllm:spec_decode_num_accepted_tokens_total{{engine="0",model_name="m"}} {accepted}
vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",position="0"}} 99
"""


def test_parse_and_difference():
    # vLLM issue 26191's MT-Bench run: 4816 drafts, 33712 draft tokens, 12208 accepted.
    a = spec_metrics.parse_counters(SAMPLE.format(drafts=100, draft_tokens=700, accepted=300))
    b = spec_metrics.parse_counters(SAMPLE.format(drafts=4916, draft_tokens=34412,
                                                  accepted=12508))
    d = spec_metrics.acceptance(a, b)
    assert d["drafts"] == 4816 and d["accepted_tokens"] == 12208
    assert d["acceptance_length"] == pytest.approx(1 + 12208 / 4816)  # 3.53
    assert d["acceptance_rate"] == pytest.approx(12208 / 33712)
    assert spec_metrics.acceptance(a, a) is None  # no drafts in between


class _Metrics(BaseHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802
        srv = self.server
        srv.calls += 1  # type: ignore[attr-defined]
        n = srv.calls  # type: ignore[attr-defined]
        body = SAMPLE.format(drafts=10 * n, draft_tokens=30 * n, accepted=17 * n).encode()
        self.send_response(200 if self.path == "/metrics" else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def test_fetch_from_a_server_and_use_in_a_calibration():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Metrics)
    srv.calls = 0  # type: ignore[attr-defined]
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    try:
        t = parse_url(f"http://127.0.0.1:{srv.server_address[1]}")
        before = spec_metrics.fetch_counters(t, 5.0)
        after = spec_metrics.fetch_counters(t, 5.0)
    finally:
        srv.shutdown()
        srv.server_close()
    d = spec_metrics.acceptance(before, after)
    assert d["acceptance_length"] == pytest.approx(1 + 17 / 10)
    lv = [{"spec_decode": d}, {}]
    assert spec_metrics.pooled_acceptance_length(lv) == pytest.approx(2.7)
    # A calibration carrying it replaces the published default; --acceptance-length wins.
    dep = capplan.deployment("llama-3.1-8b", "h100-sxm", max_model_len=4096,
                             speculative="eagle3")
    cal = default_calibration(dep.gpu).with_(spec_acceptance_length=2.7)
    measured = capplan.deployment("llama-3.1-8b", "h100-sxm", max_model_len=4096,
                                  speculative="eagle3", calibration=cal)
    assert measured.step.spec_accept_len == 2.7
    given = capplan.deployment("llama-3.1-8b", "h100-sxm", max_model_len=4096,
                               speculative="eagle3", calibration=cal, acceptance_length=2.0)
    assert given.step.spec_accept_len == 2.0


class _SGLang(BaseHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802
        ok = self.path == "/get_server_info"
        body = b'{"internal_states": [{"avg_spec_accept_length": 3.1}]}' if ok else b"no"
        self.send_response(200 if ok else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def test_sglang_server_info():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _SGLang)
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    try:
        t = parse_url(f"http://127.0.0.1:{srv.server_address[1]}")
        assert spec_metrics.fetch_counters(t, 5.0) is None  # no vLLM counters here
        got = spec_metrics.fetch_sglang_accept_length(t, 5.0)
    finally:
        srv.shutdown()
        srv.server_close()
    assert got == 3.1
    levels = [{"spec_decode": {"acceptance_length": 2.9}},
              {"spec_decode": {"acceptance_length": got}}]
    assert spec_metrics.pooled_acceptance_length(levels) == 3.1  # server-cumulative: the last
