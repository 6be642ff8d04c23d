"""Replay a plan's requests against a running OpenAI-compatible server, open loop: each request
is sent at its planned arrival time (one thread each), whatever the server's pace, as `vllm
bench serve --request-rate` does with its own arrival times. Each request streams its planned
prompt and max_tokens with ignore_eos (capplan.probe.endpoint.one_request), so outputs keep
their planned length; the level summary has the keys of `calibrate --endpoint`.

Deadlines: each request ends by --timeout of wall-clock time (capplan.probe.deadline), and the
whole replay by the last planned arrival + --timeout + 1 s (LevelDeadline.open_loop): a request
still blocked then is counted as an error, not left out of the summary."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

from capplan.probe.endpoint import (
    Interrupted,
    LevelDeadline,
    RequestResult,
    chat_target,
    check_reachable,
    level_from_requests,
    one_request,
    parse_url,
    request_body,
)
from capplan.sim import workload


def arrival_rate(reqs: Sequence[Any]) -> float | None:
    """The rate the requests were sent at: (n - 1) arrivals after the first over the span from
    the first to the last (None: fewer than two, or all at once)."""
    times = [float(r.arrival_s) for r in reqs]
    span = max(times) - min(times) if len(times) > 1 else 0.0
    return workload.arrival_rate(len(times), span) if span > 0 else None


def replay(url: str, model: str, reqs: Sequence[Any], timeout_s: float) -> dict[str, Any]:
    """Send `reqs` (objects with arrival_s, prompt, output_tokens, and images with image_urls()
    as PlannedRequest) on schedule; one level. A request with images goes to the server's
    chat-completions path.

    `in_flight_mean` is the mean number of requests in flight (Little's law: the rate sent x
    the mean E2E), the concurrency an open loop reaches. `requests_per_s` and
    `output_tokens_per_s` are the completed requests and their output tokens over `run_span_s`,
    the first send to the last completion (the drain after the last send included, as vllm
    bench serve reports them); `send_span_s` is the first send to the last, `sent` the
    requests sent; `output_tokens` are the completed ones', `sent_output_tokens` the planned
    ones of all sent (what verify's predicted throughput is for); `arrival_rate_per_s` is the
    rate they were sent at."""
    t = parse_url(url)
    check_reachable(t, timeout_s)
    results: list[RequestResult | None] = [None] * len(reqs)
    level = LevelDeadline.open_loop(max((float(r.arrival_s) for r in reqs), default=0.0),
                                    timeout_s)

    def send(i: int) -> None:
        r = reqs[i]
        try:
            images = r.image_urls() if getattr(r, "images", 0) else ()
            body = request_body(model, r.prompt, int(r.output_tokens), images)
            results[i] = one_request(chat_target(t) if images else t, model, r.prompt,
                                     int(r.output_tokens), timeout_s, body=body, level=level)
        except Exception as e:  # noqa: BLE001 - a client bug must not lose the request
            results[i] = RequestResult(ok=False, error=f"client error: {type(e).__name__}")

    threads = []
    timer = threading.Timer(level.seconds, level.expire)
    timer.daemon = True
    t0 = time.perf_counter()
    timer.start()
    try:
        for i, r in enumerate(reqs):
            wait = t0 + float(r.arrival_s) - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            th = threading.Thread(target=send, args=(i,), daemon=True)
            th.start()
            threads.append(th)
        for th in threads:  # a request ends within 1 s of the level's deadline shutting it
            th.join(max(0.0, t0 + level.seconds + LevelDeadline.SLACK_S - time.perf_counter()))
    except KeyboardInterrupt:
        level.expire()
        raise Interrupted([]) from None
    finally:
        timer.cancel()
    lost = RequestResult(ok=False, error=f"level deadline of {level.seconds:g} s passed",
                         end_s=time.perf_counter())
    done = [r if r is not None else lost for r in results[:len(threads)]]
    sent_reqs = reqs[:len(threads)]
    first = min((float(r.arrival_s) for r in sent_reqs), default=0.0)
    last = max((float(r.arrival_s) for r in sent_reqs), default=0.0)
    duration = max((r.end_s for r in done), default=t0) - (t0 + first)
    rate = arrival_rate(sent_reqs)
    ok_e2e = [r.e2e_s or 0.0 for r in done if r.ok]
    if rate is not None and ok_e2e:  # Little's law at the rate sent: L = lambda x mean E2E
        in_flight = rate * sum(ok_e2e) / len(ok_e2e)
    else:
        in_flight = sum(ok_e2e) / duration if duration > 0 else 0.0
    summary = level_from_requests(max(1, round(in_flight)), done, duration)
    n = max(len(reqs), 1)
    summary.update(run_span_s=duration, send_span_s=last - first, sent=len(done),
                   output_tokens=sum(r.output_tokens for r in done if r.ok),
                   sent_output_tokens=sum(int(r.output_tokens) for r in sent_reqs))
    if rate is not None:
        summary["arrival_rate_per_s"] = rate

    def prompt(r: Any) -> int:  # text and image tokens
        return int(getattr(r, "prompt_tokens", r.input_tokens))

    names = [str(getattr(r, "lane", "")) for r in reqs[:len(done)]]
    if len(set(names)) > 1:  # each lane's own latencies, for its own SLOs
        summary["lanes"] = {name: level_from_requests(
            1, [x for x, n in zip(done, names, strict=True) if n == name], duration)
            for name in dict.fromkeys(names)}
    summary.update(in_flight_mean=in_flight,
                   mean_input_tokens=sum(prompt(r) for r in reqs) / n,
                   mean_context_tokens=sum(prompt(r) + int(r.output_tokens) / 2
                                           for r in reqs) / n)
    return summary
