"""Deadlines of `capplan verify` (its replay of the plan's workload) against the trickling
servers of test_endpoint_deadlines: every framing ends within the last planned arrival +
--timeout + 1 s, whatever the server sends, and a request still blocked when the replay's
deadline passes is counted as an error, not dropped from the summary."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from capplan.plan.workload_file import PlannedRequest
from capplan.probe.endpoint import LevelDeadline
from capplan.probe.replay import replay
from tests.probe.test_endpoint_deadlines import FRAMINGS, TOKEN, TrickleServer
from tests.probe.test_verify import _plan

TIMEOUT_S = 0.4


@pytest.mark.parametrize("framing", list(FRAMINGS))
def test_verify_ends_within_its_deadline_on_every_framing(framing: str, tmp_path: Path,
                                                          run_cli) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(_plan(rate=20.0)))
    cal = tmp_path / "cal.yaml"
    srv = TrickleServer(framing)
    try:
        t0 = time.monotonic()
        res = run_cli("verify", str(plan), "--endpoint", srv.url, "--requests", "3",
                      "--timeout", str(TIMEOUT_S), "--out", str(cal), "--format", "json")
        took = time.monotonic() - t0
    finally:
        srv.close()
    # open loop: three requests in flight at once, the last sent by its planned arrival
    # (20 req/s: well under 1 s); each ends by --timeout, with 1 s of slack per request
    assert took < 1.0 + 3 * (TIMEOUT_S + 1.0), took
    assert res.exit_code in (1, 2), (res.exit_code, res.stdout, res.stderr)
    assert res.stderr.count("\n") == 1 and res.stderr.startswith("Error: "), res.stderr
    assert not cal.exists()
    assert "every request failed (timeout after 0.4 s x3)" in res.stderr, res.stderr
    assert "--gpu" not in res.stderr  # before: the calibration's refusal hid the cause


def test_open_loop_deadline_is_last_arrival_plus_timeout() -> None:
    level = LevelDeadline.open_loop(2.5, 0.4)
    assert level.seconds == pytest.approx(2.5 + 0.4 + LevelDeadline.SLACK_S)


def test_every_request_sent_is_in_the_summary() -> None:
    """A request that ends by its deadline is an error of the level, none is left out."""
    srv = TrickleServer("chunked")
    reqs = [PlannedRequest(0.05 * i, 8, 4, "chat", i) for i in range(4)]
    try:
        lv = replay(srv.url, "m", reqs, TIMEOUT_S)
    finally:
        srv.close()
    assert lv["completed"] + lv["errors"] == 4 and lv["errors"] == 4


class _HalfFailing(TrickleServer):
    """Odd connections get a server error event, even ones a full 6-token stream."""

    GOOD = [TOKEN] * 6 + [b"data: [DONE]\n\n"]
    BAD = [TOKEN, b'data: {"error": "KV cache full"}\n\n']

    def __init__(self) -> None:
        self.n = 0
        super().__init__("http10", self.GOOD)

    def _handle(self, conn) -> None:  # type: ignore[no-untyped-def]
        self.n += 1
        self.events = self.BAD if self.n % 2 else self.GOOD
        super()._handle(conn)


@pytest.mark.parametrize("fmt", ["table", "markdown", "csv"])
def test_first_error_and_units_in_every_format(fmt: str, tmp_path: Path, run_cli) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(_plan(rate=20.0)))
    srv = _HalfFailing()
    try:
        res = run_cli("verify", str(plan), "--endpoint", srv.url, "--requests", "4",
                      "--timeout", "5", "--format", fmt)
    finally:
        srv.close()
    assert res.exit_code == 0, res.stderr
    assert "server error: KV cache full" in res.stdout + res.stderr
    # a rate is per second, not a duration in ms (before: 120 tok/s printed as 1.2e+05 ms)
    line = next(ln for ln in res.stdout.splitlines() if "output_tokens_per_s" in ln)
    assert "/s" in line and "e+" not in line, line  # ~100 tok/s for this run, not 1e5


def test_out_is_checked_before_any_request(tmp_path: Path, run_cli) -> None:
    """Before: the workload ran first, then --out failed and the measurement was lost (here
    nothing listens: the folder is refused before the connection is tried)."""
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(_plan()))
    res = run_cli("verify", str(plan), "--endpoint", "http://127.0.0.1:9", "--requests", "2",
                  "--out", str(tmp_path / "missing" / "cal.yaml"))
    assert res.exit_code == 2 and "does not exist" in res.stderr, res.stderr
