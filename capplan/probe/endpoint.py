"""Benchmark a running OpenAI-compatible server (vLLM, SGLang...), standard library only.

Each level runs a closed loop of C client threads (as `vllm bench serve --max-concurrency`):
each POSTs {URL}/v1/completions with stream=true, max_tokens and ignore_eos, reads the
server-sent events (`data: {...}` lines, then `data: [DONE]`) and stamps every event that
carries text. Per request, as vLLM's benchmark defines them (vllm/benchmarks/serve.py):
TTFT = first token time - send time; ITL = every gap between consecutive token events;
E2E = last event - send time; TPOT = (E2E - TTFT) / (output tokens - 1).
A stall past --timeout, an error mid-stream or a cut connection makes the request an error;
malformed events are counted and skipped. What was measured is always reported.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from capplan.errors import InputError, ProbeUnavailable
from capplan.probe.results import level_summary

_WORD = "hello "
"""One short English word plus a space is about one token for Llama/GPT tokenizers."""


@dataclass
class RequestResult:
    ok: bool
    ttft_s: float | None = None
    itl_s: list[float] = field(default_factory=list)
    e2e_s: float | None = None
    output_tokens: int = 0
    malformed_events: int = 0
    error: str | None = None
    start_s: float = 0.0
    end_s: float = 0.0

    @property
    def tpot_s(self) -> float | None:
        if not self.ok or self.ttft_s is None or self.e2e_s is None or self.output_tokens < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (self.output_tokens - 1)


@dataclass(frozen=True)
class Target:
    host: str
    port: int
    https: bool
    path: str


def parse_url(url: str) -> Target:
    parts = urlsplit(url if "://" in url else f"http://{url}")
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InputError(f"--endpoint {url!r}: expected http://HOST:PORT")
    base = parts.path.rstrip("/")
    base = base.removesuffix("/v1/completions").removesuffix("/v1")
    return Target(parts.hostname, parts.port or (443 if parts.scheme == "https" else 80),
                  parts.scheme == "https", f"{base}/v1/completions")


def check_reachable(t: Target, timeout_s: float) -> None:
    """Connection refused or unresolvable host: one line, exit 2."""
    try:
        socket.create_connection((t.host, t.port), timeout=min(timeout_s, 10.0)).close()
    except OSError as e:
        reason = e.strerror or type(e).__name__
        raise ProbeUnavailable(f"cannot connect to {t.host}:{t.port}: {reason} "
                               "(is the server running?)") from e


def _tokens_in(event: dict[str, Any]) -> int:
    """Whether a streamed completion event carries output text (1) or not (0)."""
    choices = event.get("choices") or []
    if not choices:
        return 0
    c = choices[0]
    text = c.get("text")
    if text is None:
        text = (c.get("delta") or {}).get("content")
    return 1 if text else 0


def one_request(t: Target, model: str, prompt: str, output_len: int, timeout_s: float
                ) -> RequestResult:
    """One streamed completion; never raises (errors are recorded in the result)."""
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": output_len,
                       "ignore_eos": True, "stream": True, "temperature": 0.0,
                       "stream_options": {"include_usage": True}}).encode()
    cls = http.client.HTTPSConnection if t.https else http.client.HTTPConnection
    res = RequestResult(ok=False)
    conn = cls(t.host, t.port, timeout=timeout_s)
    start = res.start_s = time.perf_counter()
    deadline = start + timeout_s
    last = None
    usage_tokens = None
    try:
        conn.request("POST", t.path, body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            res.error = f"HTTP {resp.status}"
            return res
        done = False
        while not done:
            raw = resp.readline()
            now = time.perf_counter()
            if not raw:
                res.error = "stream ended before [DONE]"
                break
            if now > deadline:
                res.error = f"timeout after {timeout_s:g} s"
                break
            line = raw.decode("utf-8", "replace").strip()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                done = True
                break
            try:
                event = json.loads(data)
                if not isinstance(event, dict):
                    raise ValueError("event is not an object")
            except ValueError:
                res.malformed_events += 1
                continue
            if "error" in event:
                res.error = f"server error: {str(event['error'])[:80]}"
                break
            if isinstance(event.get("usage"), dict):
                usage_tokens = event["usage"].get("completion_tokens", usage_tokens)
            if _tokens_in(event):
                if last is None:
                    res.ttft_s = now - start
                else:
                    res.itl_s.append(now - last)
                last = now
                res.output_tokens += 1
        res.ok = done and last is not None
        if done and last is None:
            res.error = "no tokens received"
    except TimeoutError:
        res.error = f"timeout after {timeout_s:g} s"
    except (OSError, http.client.HTTPException) as e:
        res.error = f"{type(e).__name__}: {e}"[:120]
    finally:
        conn.close()
    res.end_s = time.perf_counter()
    if last is not None:
        res.e2e_s = last - start
    if res.ok and usage_tokens:
        res.output_tokens = int(usage_tokens)  # several tokens may share one event
    return res


def run_level(t: Target, model: str, concurrency: int, num_requests: int, input_len: int,
              output_len: int, timeout_s: float) -> dict[str, Any]:
    """A closed loop of `concurrency` clients until `num_requests` requests have been sent."""
    prompt = _WORD * max(1, input_len - 1)
    results: list[RequestResult] = []
    lock = threading.Lock()
    issued = [0]

    def worker() -> None:
        while True:
            with lock:
                if issued[0] >= num_requests:
                    return
                issued[0] += 1
            r = one_request(t, model, prompt, output_len, timeout_s)
            with lock:
                results.append(r)

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(concurrency)]
    t0 = time.perf_counter()
    for th in threads:
        th.start()
    try:
        for th in threads:
            th.join()
    except KeyboardInterrupt:
        pass  # report what finished
    duration = time.perf_counter() - t0
    with lock:
        done = list(results)
    return level_from_requests(concurrency, done, duration)


def level_from_requests(concurrency: int, reqs: list[RequestResult], duration_s: float
                        ) -> dict[str, Any]:
    ok = [r for r in reqs if r.ok]
    errors: dict[str, int] = {}
    for r in reqs:
        if not r.ok:
            errors[r.error or "error"] = errors.get(r.error or "error", 0) + 1
    return level_summary(
        concurrency=concurrency,
        ttfts=[r.ttft_s for r in ok if r.ttft_s is not None],
        itls=[g for r in ok for g in r.itl_s],
        e2es=[r.e2e_s for r in ok if r.e2e_s is not None],
        tpots=[x for r in ok if (x := r.tpot_s) is not None],
        output_tokens=sum(r.output_tokens for r in ok), completed=len(ok),
        duration_s=duration_s, errors=sum(errors.values()), error_kinds=errors,
        malformed_events=sum(r.malformed_events for r in reqs))


def run_endpoint(url: str, model: str, concurrency: list[int], input_len: int, output_len: int,
                 requests_per_level: int | None, timeout_s: float) -> list[dict[str, Any]]:
    """Every level in turn; refused connections fail fast, before any level."""
    t = parse_url(url)
    check_reachable(t, timeout_s)
    levels = []
    for c in concurrency:
        n = requests_per_level or max(8, 4 * c)
        try:
            lv = run_level(t, model, c, n, input_len, output_len, timeout_s)
        except KeyboardInterrupt:
            break
        lv["mean_context_tokens"] = input_len + output_len / 2
        lv["mean_input_tokens"] = float(input_len)
        levels.append(lv)
    return levels
