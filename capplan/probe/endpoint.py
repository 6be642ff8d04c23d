"""Benchmark a running OpenAI-compatible server (vLLM, SGLang...), standard library only.

Each level runs a closed loop of C client threads (as `vllm bench serve --max-concurrency`):
each POSTs {URL}/v1/completions with stream=true, max_tokens and ignore_eos, reads the
server-sent events (`data: {...}` lines, then `data: [DONE]`) and stamps every event that
carries text. Per request, as vLLM's benchmark defines them (vllm/benchmarks/serve.py):
TTFT = first token time - send time; ITL = every gap between consecutive token events;
E2E = last event - send time; TPOT = (E2E - TTFT) / (output tokens - 1).
Output tokens: the server's `usage.completion_tokens` (asked with stream_options.include_usage);
a server that sends no usage streamed max_tokens tokens unless it says it stopped early
(finish_reason "stop": ignore_eos not honoured), as every request asks ignore_eos; only then
are tokens counted one per text event, which undercounts when an event carries several (the
level then has a warning). `vllm bench serve` tokenizes the text in that case; capplan has no
tokenizer.
Every field from the server is checked (type, sign, range): an event with a wrong one, a stall
past --timeout, a request running past its wall-clock deadline (--timeout; a server that
trickles bytes cannot extend it), an event line over 1 MiB, an error mid-stream or a cut
connection makes that request an error; lines that are not JSON are counted and skipped.
Ctrl-C stops the run (Interrupted carries the levels measured before it).
"""

from __future__ import annotations

import http.client
import json
import math
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import urlsplit

from capplan.errors import InputError, ProbeUnavailable
from capplan.probe.deadline import Deadline as _Deadline
from capplan.probe.deadline import connection as _connection
from capplan.probe.results import level_summary
from capplan.probe.spec_metrics import acceptance, fetch_counters, fetch_sglang_accept_length

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
    finish_reason: str | None = None
    token_source: str = "events"
    """Where output_tokens comes from: usage, max_tokens (no usage, ignore_eos) or events."""

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
    try:
        parts = urlsplit(url if "://" in url else f"http://{url}")
        port = parts.port  # raises ValueError when not a number or outside 0..65535
    except ValueError as e:
        raise InputError(f"--endpoint {url[:80]!r}: {e} (expected http://HOST:PORT)") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InputError(f"--endpoint {url[:80]!r}: expected http://HOST:PORT")
    if port == 0:
        raise InputError(f"--endpoint {url[:80]!r}: port 0 is not a server's port")
    base = parts.path.rstrip("/")
    base = base.removesuffix("/v1/completions").removesuffix("/v1")
    return Target(parts.hostname, port or (443 if parts.scheme == "https" else 80),
                  parts.scheme == "https", f"{base}/v1/completions")


def check_reachable(t: Target, timeout_s: float) -> None:
    """Connection refused or unresolvable host: one line, exit 2."""
    try:
        socket.create_connection((t.host, t.port), timeout=min(timeout_s, 10.0)).close()
    except (OSError, UnicodeError, ValueError) as e:
        reason = getattr(e, "strerror", None) or type(e).__name__
        raise ProbeUnavailable(f"cannot connect to {t.host}:{t.port}: {reason} "
                               "(is the server running?)") from e


MAX_EVENT_BYTES = 1 << 20
"""Longest server-sent event line accepted (1 MiB): a streamed completion event carries one
token or a few, ~200 bytes; a 1 GB line would otherwise be held in memory whole."""


class BadEvent(ValueError):
    """A well-formed JSON event whose fields have the wrong type, sign or range."""


def _text_of(choice: Any) -> str | None:
    if not isinstance(choice, dict):
        raise BadEvent("choices[0] is not an object")
    text = choice.get("text")
    if text is None:
        delta = choice.get("delta")
        if delta is None:
            return None
        if not isinstance(delta, dict):
            raise BadEvent("choices[0].delta is not an object")
        text = delta.get("content")
    if text is not None and not isinstance(text, str):
        raise BadEvent("the token text is not a string")
    return text


def _usage_tokens(event: dict[str, Any], max_tokens: int) -> int | None:
    usage = event.get("usage")
    if usage is None:
        return None
    if not isinstance(usage, dict):
        raise BadEvent("usage is not an object")
    n = usage.get("completion_tokens")
    if n is None:
        return None
    if isinstance(n, bool) or not isinstance(n, int):
        raise BadEvent(f"usage.completion_tokens {str(n)[:20]} is not a whole number")
    if not 0 <= n <= max_tokens:
        raise BadEvent(f"usage.completion_tokens {n} is outside 0..max_tokens {max_tokens}")
    return n


def read_event(event: Any, max_tokens: int) -> tuple[int, int | None]:
    """(1 if the event carries output text else 0, usage completion_tokens or None).

    Raises:
        BadEvent: a field of the wrong type, sign or range (an error for the request).
    """
    if not isinstance(event, dict):
        raise BadEvent("an event is not a JSON object")
    if "error" in event:
        raise BadEvent(f"server error: {str(event['error'])[:80]}")
    choices = event.get("choices")
    if choices is not None and not isinstance(choices, list):
        raise BadEvent("choices is not a list")
    text = _text_of(choices[0]) if choices else None
    return (1 if text else 0), _usage_tokens(event, max_tokens)


def _finish_reason(event: Any) -> str | None:
    choices = event.get("choices") if isinstance(event, dict) else None
    first = choices[0] if isinstance(choices, list) and choices else None
    reason = first.get("finish_reason") if isinstance(first, dict) else None
    return reason if isinstance(reason, str) else None


def _finite_json(data: str) -> Any:
    """json.loads that refuses NaN and Infinity (not JSON; Python's parser allows them)."""
    def bad(x: str) -> Any:
        raise BadEvent(f"{x} is not a JSON number")
    return json.loads(data, parse_constant=bad,
                      parse_float=lambda x: _finite_float(x))


def _finite_float(x: str) -> float:
    v = float(x)
    if not math.isfinite(v):
        raise BadEvent(f"{x[:20]} overflows a float")
    return v


class LevelDeadline:
    """A wall-clock deadline for a whole level: at expiry every request in flight has its
    socket shut and no new request starts. Each client sends its requests one after another,
    each bounded by --timeout, so a level ends by timeout x ceil(requests / clients); this
    bound holds even where a per-request deadline cannot act (a connect blocked in DNS)."""

    SLACK_S = 1.0

    def __init__(self, timeout_s: float, num_requests: int, concurrency: int):
        self.seconds = timeout_s * math.ceil(num_requests / concurrency) + self.SLACK_S
        self.passed = False
        self._active: set[_Deadline] = set()
        self._lock = threading.Lock()

    @classmethod
    def open_loop(cls, last_arrival_s: float, timeout_s: float) -> LevelDeadline:
        """An open loop (capplan verify) sends its last request at `last_arrival_s` whatever
        the server's pace, and each request ends by --timeout: the level ends by their sum."""
        level = cls(timeout_s, 1, 1)
        level.seconds = max(0.0, last_arrival_s) + timeout_s + cls.SLACK_S
        return level

    def add(self, d: _Deadline) -> bool:
        with self._lock:
            if not self.passed:
                self._active.add(d)
            return not self.passed

    def discard(self, d: _Deadline) -> None:
        with self._lock:
            self._active.discard(d)

    def expire(self) -> None:
        with self._lock:
            self.passed = True
            active = list(self._active)
        for d in active:
            d.expire()


def _stream(resp: http.client.HTTPResponse, res: RequestResult, start: float,
            max_tokens: int, clock: Callable[[], float]) -> tuple[bool, float | None, int | None]:
    """Read events until [DONE]; returns (done, last token time, usage tokens)."""
    last = usage_tokens = None
    while True:
        raw = resp.readline(MAX_EVENT_BYTES + 1)
        now = clock()
        if not raw:
            res.error = "stream ended before [DONE]"
            return False, last, usage_tokens
        if len(raw) > MAX_EVENT_BYTES:
            res.error = f"an event exceeds {MAX_EVENT_BYTES // 1024} KiB"
            return False, last, usage_tokens
        line = raw.decode("utf-8", "replace").strip()
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            return True, last, usage_tokens
        try:
            event = _finite_json(data)
        except json.JSONDecodeError:
            res.malformed_events += 1  # not JSON at all: skipped, counted
            continue
        has_text, n = read_event(event, max_tokens)  # BadEvent: an error for the request
        usage_tokens = n if n is not None else usage_tokens
        res.finish_reason = _finish_reason(event) or res.finish_reason
        if has_text:
            if last is None:
                res.ttft_s = now - start
            else:
                res.itl_s.append(now - last)
            last = now
            res.output_tokens += 1
            if res.output_tokens > max_tokens:  # every text event is at least one token
                raise BadEvent(f"more token events than max_tokens {max_tokens}")


def request_body(model: str, prompt: str, output_len: int,
                 images: tuple[str, ...] = ()) -> bytes:
    """The completion request, encoded once per level and shared by its clients; with
    `images` (URLs, data URLs included), a chat completion whose one user message holds the
    images and then the text (OpenAI `image_url` content parts, as vLLM and SGLang take them):
    send it to chat_target(t)."""
    body: dict[str, Any] = {"model": model, "max_tokens": output_len, "ignore_eos": True,
                            "stream": True, "temperature": 0.0,
                            "stream_options": {"include_usage": True}}
    if images:
        body["messages"] = [{"role": "user", "content": [
            *({"type": "image_url", "image_url": {"url": u}} for u in images),
            {"type": "text", "text": prompt}]}]
    else:
        body["prompt"] = prompt
    return json.dumps(body).encode()


def chat_target(t: Target) -> Target:
    """The same server's chat-completions path (requests with images)."""
    return replace(t, path=t.path.removesuffix("/v1/completions") + "/v1/chat/completions")


def one_request(t: Target, model: str, prompt: str, output_len: int, timeout_s: float,
                clock: Callable[[], float] = time.perf_counter,
                body: bytes | None = None, level: LevelDeadline | None = None
                ) -> RequestResult:
    """One streamed completion; never raises (errors are recorded in the result).

    `clock` stamps the events (tests drive their own); the deadline of `timeout_s` seconds is
    wall-clock time from the start, whatever the server sends.
    """
    body = body if body is not None else request_body(model, prompt, output_len)
    res = RequestResult(ok=False)
    deadline = _Deadline(timeout_s)
    if level is not None and not level.add(deadline):
        res.error = f"level deadline of {level.seconds:g} s passed"
        return res
    conn = _connection(t, timeout_s, deadline)
    start = res.start_s = clock()
    last = usage_tokens = None
    try:
        with deadline:
            conn.request("POST", t.path, body=body,
                         headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            ctype = resp.getheader("Content-Type") or ""
            if resp.status != 200:
                res.error = f"HTTP {resp.status}"
            elif "json" in ctype.lower():  # one whole answer: stream=true was not honoured
                res.error = f"the server did not stream (Content-Type {ctype.split(';')[0]})"
            else:
                done, last, usage_tokens = _stream(resp, res, start, output_len, clock)
                res.ok = done and last is not None
                if done and last is None:
                    res.error = "no tokens received"
    except BadEvent as e:
        res.error = f"bad event: {e}"[:120]
    except TimeoutError:
        res.error = f"timeout after {timeout_s:g} s"
    except (OSError, http.client.HTTPException, ValueError) as e:
        res.error = f"{type(e).__name__}: {e}"[:120]
    finally:
        conn.close()
        if level is not None:
            level.discard(deadline)
    if deadline.expired:
        res.ok, res.error = False, f"timeout after {timeout_s:g} s"
        if level is not None and level.passed:
            res.error = f"level deadline of {level.seconds:g} s passed"
    res.end_s = clock()
    if last is not None:
        res.e2e_s = last - start
    if res.ok:
        count_tokens(res, usage_tokens, output_len)
    return res


def count_tokens(res: RequestResult, usage_tokens: int | None, max_tokens: int) -> None:
    """A completed request's output tokens: usage, else max_tokens (ignore_eos was asked)
    unless the server says it stopped early, else one per text event (several tokens may
    share one event: then too few)."""
    if usage_tokens:
        res.output_tokens, res.token_source = usage_tokens, "usage"
    elif res.finish_reason != "stop":
        res.output_tokens, res.token_source = max_tokens, "max_tokens"


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during an endpoint run: carries the levels measured before it."""

    def __init__(self, levels: list[dict[str, Any]]):
        super().__init__()
        self.levels = levels


def run_level(t: Target, model: str, concurrency: int, num_requests: int, input_len: int,
              output_len: int, timeout_s: float,
              clock: Callable[[], float] = time.perf_counter) -> dict[str, Any]:
    """A closed loop of `concurrency` clients until `num_requests` requests have been sent.

    Raises:
        KeyboardInterrupt: Ctrl-C; the clients stop sending (requests in flight are dropped).
    """
    prompt = _WORD * max(1, input_len - 1)
    body = request_body(model, prompt, output_len)
    results: list[RequestResult] = []
    lock = threading.Lock()
    issued = [0]
    stop = threading.Event()
    level = LevelDeadline(timeout_s, num_requests, concurrency)

    def worker() -> None:
        while not stop.is_set() and not level.passed:
            with lock:
                if issued[0] >= num_requests:
                    return
                issued[0] += 1
            try:
                r = one_request(t, model, prompt, output_len, timeout_s, clock, body, level)
            except Exception as e:  # noqa: BLE001 - a client bug must not lose the request
                r = RequestResult(ok=False, error=f"client error: {type(e).__name__}")
            with lock:
                results.append(r)

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(concurrency)]
    timer = threading.Timer(level.seconds, level.expire)
    timer.daemon = True
    t0 = time.perf_counter()
    timer.start()
    for th in threads:
        th.start()
    try:
        for th in threads:  # a request ends within 1 s of the level's deadline shutting it
            th.join(max(0.0, t0 + level.seconds + LevelDeadline.SLACK_S - time.perf_counter()))
    except KeyboardInterrupt:
        stop.set()
        level.expire()
        raise
    finally:
        timer.cancel()
    duration = time.perf_counter() - t0
    with lock:
        done = list(results)
        issued_n = issued[0]
    lost = issued_n - len(done)  # still blocked past the level's deadline: errors
    done += [RequestResult(ok=False, error=f"level deadline of {level.seconds:g} s passed")
             for _ in range(lost)]
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
        malformed_events=sum(r.malformed_events for r in reqs),
        **_token_sources(ok),
        **({"first_error": first} if (first := next(
            (r.error or "error" for r in reqs if not r.ok), None)) else {}))


def _token_sources(ok: list[RequestResult]) -> dict[str, Any]:
    """How the completed requests' output tokens were counted; a warning when some were
    counted per stream event (no usage, stopped before max_tokens)."""
    sources: dict[str, int] = {}
    for r in ok:
        sources[r.token_source] = sources.get(r.token_source, 0) + 1
    out: dict[str, Any] = {"output_tokens_from": sources} if sources else {}
    if sources.get("events"):
        out["warnings"] = [
            f"{sources['events']} of {len(ok)} requests sent no usage and stopped before "
            "max_tokens: their output tokens are counted one per stream event, too few if an "
            "event carries several tokens (TPOT and output tok/s are then per event)"]
    return out


SIDE_TIMEOUT_S = 1.0
"""Deadline of the side requests (/metrics, SGLang's /get_server_info): a server answers them
in milliseconds. Each is asked before and after every level; with --timeout as their deadline
a server that trickles them added 3 x --timeout to a level's time."""


class _SideRequests:
    """The speculative-decoding counters, asked within SIDE_TIMEOUT_S; a server that lets one
    run out of time is not asked again in this run."""

    def __init__(self, t: Target, timeout_s: float):
        self.t, self.seconds, self.answers = t, min(timeout_s, SIDE_TIMEOUT_S), True

    def _ask(self, fetch: Callable[[Any, float], Any]) -> Any:
        if not self.answers:
            return None
        t0 = time.monotonic()
        got = fetch(self.t, self.seconds)
        if got is None and time.monotonic() - t0 >= self.seconds:  # ran out its deadline
            self.answers = False
        return got

    def counters(self) -> dict[str, float] | None:
        return self._ask(fetch_counters)

    def sglang_accept_length(self) -> float | None:
        return self._ask(fetch_sglang_accept_length)


def run_endpoint(url: str, model: str, concurrency: list[int], input_len: int, output_len: int,
                 requests_per_level: int | None, timeout_s: float) -> list[dict[str, Any]]:
    """Every level in turn; refused connections fail fast, before any level."""
    t = parse_url(url)
    check_reachable(t, timeout_s)
    levels: list[dict[str, Any]] = []
    side = _SideRequests(t, timeout_s)
    for c in concurrency:
        n = requests_per_level or max(8, 4 * c)
        before = side.counters()  # speculative decoding, when the server has it
        try:
            lv = run_level(t, model, c, n, input_len, output_len, timeout_s)
        except KeyboardInterrupt:
            raise Interrupted(levels) from None
        spec = acceptance(before, side.counters() if before else None)
        if spec is None and before is None:
            sg = side.sglang_accept_length()
            spec = {"acceptance_length": sg, "source": "sglang /get_server_info "
                    "avg_spec_accept_length (server-cumulative)"} if sg else None
        if spec:
            lv["spec_decode"] = spec
        lv["mean_context_tokens"] = input_len + output_len / 2
        lv["mean_input_tokens"] = float(input_len)
        levels.append(lv)
    return levels
