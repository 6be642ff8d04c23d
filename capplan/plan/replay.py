"""Which model answers `latency`: the simulator's replay for time-dependent loads, the analytic
queue only where it agrees with the replay (docs/queueing.md, "Which model answers").

- Closed loops (`--concurrency`, as benchmark clients run them) and traces are replayed: the
  simulator runs the same requests through the engine's scheduler step by step (its one loop,
  compiled when numba is installed, else interpreted, with the same results) and its figures
  are the answer. Quantiles come from the replay's token
  gaps (capplan.sim.metrics), never from time shares.
- An open-loop rate (`--rate`) is answered by the analytic queue (capplan.models.queueing) when
  its TTFT and TBT, mean and p99, are each within TOLERANCE of the replay of the same load;
  otherwise the replay answers. The output names which (`answered_by`) and, for a rate, the
  analytic figures and their relative differences (`analytic_check`).
- LoRA with fewer slots than the traffic's adapters: the replay answers every rate, overloaded
  ones included (its served rate is the capacity). The analytic queue does not model a
  request's wait for its adapter's slot (vLLM skips it until a running adapter has no running
  request, `lora_slot_warning`), so it screens nothing there (`analytic_check.reason`).
- A trace whose rate varies across windows by more than TOLERANCE is flagged with its peak
  window (`trace.peak_window`, a warning): one replica's replay of a whole day is what one
  replica would do, not a fleet plan (`recommend --trace`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from capplan.plan.deployment import Deployment
from capplan.plan.load import LoadSpec, analytic_latency
from capplan.plan.search import slot_shortfall
from capplan.plan.simulation import run_simulation
from capplan.sim.protocol import PRESETS, BenchmarkRun, preset

TOLERANCE = 0.15
"""Relative difference of TTFT / TBT (mean and p99) within which the analytic queue may answer
for the replay (issue acceptance: latency and simulate agree within 15%)."""
SCREEN_TOLERANCE = 0.10
"""Relative difference within which the analytic queue answers for the 2,000-request replay: the
promise is TOLERANCE against any replay of the load, and a 2,000-request replay's p99 differs
from a longer one's by a few percent (sampling), so the screen keeps that margin."""
WINDOW_S = 900.0
"""Window over which a trace's rate is read for the varying-rate check (15 min, as fleet plans
use)."""
OPEN_LOOP_REQUESTS = 2000
"""Requests replayed to check an open-loop rate. Long enough for the tails to settle: at 10
req/s (Llama-3.1-8B, H100, 1024/256) the TBT p99 of 1,000 requests is 29.8 ms, of 2,000 45.1 ms,
of 5,000 44.7 ms (the start and the drain of a short run dilute the steps that carry two
prompts' chunks)."""
LORA_REPLAY_REQUESTS = 10_000
"""Requests replayed for an open-loop rate whose LoRA slots are fewer than its adapters: the
slots pass from adapter to adapter in cycles of tens of seconds (an adapter keeps its slot while
any of its requests runs), and a 2,000-request replay spans few of them. Llama-3.1-8B, H100,
500/300 tokens, 1 slot over 8 uniform adapters: mean TTFT 21.7 s at 5 req/s and 71.8 s at 10
with 10,000 requests, 22.0 s and 76.2 s with 40,000; with 2,000 the 5 req/s run read as
overloaded and the 10 req/s one as stable at 51.8 s."""
CHECKED = (("ttft_s", "mean"), ("ttft_s", "p99"), ("tbt_s", "mean"), ("tbt_s", "p99"),
           ("tpot_s", "p99"))
"""The figures the analytic answer must match the replay on (SCREEN_TOLERANCE) to answer."""
LATENCY_KEYS = ("ttft_s", "tbt_s", "e2e_s", "tpot_s", "queue_s", "output_tokens_per_s",
                "input_tokens_per_s", "requests_per_s", "mean_running_batch", "preemptions",
                "kv_peak_utilization", "makespan_s", "num_requests", "engine_impl", "benchmark")


@dataclass(frozen=True, kw_only=True)
class ReplayLoad:
    """What `latency` was asked to answer (the options of one load level)."""

    rate: float | None = None
    concurrency: int | None = None
    trace: str | None = None
    input_len: str = "512"
    output_len: str = "256"
    burstiness: float = 1.0
    num_prompts: int | None = None
    warmup_prompts: int = 0
    time_unit: str = "auto"
    prefix: Any = None
    benchmark: str | None = None
    seed: int = 0
    window_s: float = WINDOW_S


def rel_diff(a: float, b: float) -> float:
    """|a - b| / b (0 when both are 0, or both NaN: no samples in either, e.g. TBT of one-token
    outputs; inf when b is 0 and a is not, or one is not finite)."""
    if math.isnan(a) and math.isnan(b):
        return 0.0
    if not (math.isfinite(a) and math.isfinite(b)):
        return math.inf
    if b == 0:
        return 0.0 if a == 0 else math.inf
    return abs(a - b) / abs(b)


def _bench_run(load: ReplayLoad) -> BenchmarkRun | None:
    """The protocol a closed loop is measured with: the named preset, else `vllm bench serve`'s
    (what --concurrency means) with the given warm-ups; open loops only with --benchmark."""
    if load.trace is not None:
        return None
    if load.benchmark is not None:
        return BenchmarkRun.of(preset(load.benchmark), load.concurrency, load.num_prompts,
                               load.warmup_prompts or None)
    if load.concurrency is not None:
        return BenchmarkRun.of(PRESETS["vllm"], load.concurrency, load.num_prompts,
                               load.warmup_prompts)
    return None


def replay(dep: Deployment, load: ReplayLoad, trace: Any = None) -> dict[str, Any]:
    """The simulator's answer for one load: head, result and notes of run_simulation (`trace`:
    the load's trace already read, else it is read from `load.trace`).

    Every load runs the compiled loop whenever numba is installed: loading it costs ~0.7-1.5 s
    once per process, and a 2,000-request check at a low rate then takes ~0.02-0.1 s (the
    same loop interpreted: ~5 s). Both give the same results (tests/sim/test_jit_equality.py)."""
    from capplan.sim import compiled_available

    bench = _bench_run(load)
    open_loop = LORA_REPLAY_REQUESTS if lora_slot_warning(dep) else OPEN_LOOP_REQUESTS
    requests = (bench.measured if bench is not None else open_loop
                if load.rate is not None else 1000)
    engine = "compiled" if compiled_available() else "auto"
    return run_simulation(dep, rate=load.rate, concurrency=load.concurrency,
                          trace=load.trace if trace is None else trace,
                          input_len=load.input_len, output_len=load.output_len,
                          burstiness=load.burstiness, requests=requests, seed=load.seed,
                          schedulers=("continuous",), time_unit=load.time_unit,
                          prefix=load.prefix, benchmark=bench, sim_engine=engine)


ANSWER_KEYS = ("engine", "engine_impl", "num_requests", "analytic_check",
               "step_s", "decode_step_s", "prefill_step_s", "prefill_step_frac",
               "prefill_utilization", "slot_utilization", "kv_mean_utilization",
               "concurrency_cap", "queue_s", "makespan_s", "prefix_hit_tokens",
               "cached_tokens_per_request", "offered_requests_per_s",
               "capacity_requests_per_s", "reason")
"""Keys every `latency` answer carries beside LATENCY_KEYS, null where the answerer has no such
figure: the analytic queue's step and utilisation figures (`step_s`...`concurrency_cap`), the
replay's `queue_s` and `makespan_s`, the screen's `analytic_check`, the replay's size
(`engine_impl`, `num_requests`), prefix-cache hits, and an unstable load's
`offered_requests_per_s`, `capacity_requests_per_s` and `reason`. One key set whichever model
answers, so that the rows of `latency --rate 5,10,20 --format json` line up."""


def answer(dep: Deployment, load: ReplayLoad, spec: LoadSpec | None) -> dict[str, Any]:
    """`latency`'s result for one load: the replay's figures, or the analytic queue's for an
    open-loop rate where they agree within TOLERANCE (module docstring). `spec` is the analytic
    load (None: no analytic screen applies, e.g. prefix sharing under a closed loop). Every
    answer carries LATENCY_KEYS and ANSWER_KEYS (null where its answerer has no such figure)."""
    res = _answer(dep, load, spec)
    res.setdefault("engine", dep.profile.label)
    return {**res, **{k: None for k in (*LATENCY_KEYS, *ANSWER_KEYS) if k not in res}}


def _answer(dep: Deployment, load: ReplayLoad, spec: LoadSpec | None) -> dict[str, Any]:
    """answer() before its key set is completed."""
    screen = load.rate is not None and load.benchmark is None and spec is not None
    ana = analytic_latency(dep, spec) if screen and spec is not None else None
    slot_wait = lora_slot_warning(dep)
    if ana is not None and not ana.get("stable") and slot_wait is None:
        out = _overloaded(ana)
        if spec is not None and out.get("bound") == "concurrency cap":
            w = whole_prompt_warning(dep, spec.input_stats.mean, math.inf)
            out["warnings"] += [w] if w else []
        return out
    trace, tr = None, None
    if load.trace is not None:  # read once: its windows here, its requests for the replay
        from capplan.sim.workload import load_trace

        trace = load_trace(load.trace, load.time_unit)
        tr = trace_windows(load, trace)
    res = _replayed(dep, load, replay(dep, load, trace))
    if tr is not None:
        _add_trace(res, tr)
    if not res["stable"]:  # the replay's backlog grew: it has no steady state to report
        if ana is not None and ana.get("stable"):
            res["notes"].append("the analytic queue screened this rate as stable; the replay, "
                                "which it is checked against, answers")
        res["notes"].insert(0, answered_note(res))
        return res
    if ana is not None:
        res = _screen(ana, res, None if slot_wait is None else LORA_SLOT_REASON)
    if res["answered_by"] == "replay" and load.rate is not None and res.get("makespan_s"):
        res["notes"].append(drain_note(res, load.rate))
    res["notes"].insert(0, answered_note(res))
    if res.get("requests_per_s"):
        w = whole_prompt_warning(dep, res["input_tokens_per_s"] / res["requests_per_s"],
                                 res.get("mean_running_batch") or 0.0)
        res["warnings"] += [w] if w else []
    res["warnings"] += [slot_wait] if slot_wait else []
    res["notes"] += stall_note(dep, res)
    return res


def stall_note(dep: Deployment, res: dict[str, Any]) -> list[str]:
    """Say what removes a TBT tail of prompt work (p99 over STALL_TAIL x the median): the
    engine option that shares steps with the decodes when its default stops them or runs
    prompts whole (plan/alternatives.py STALL_OPTIONS), else a smaller token budget for the
    chunks that already share them."""
    from capplan.plan.alternatives import stall_option

    tbt = res.get("tbt_s") or {}
    if not tbt.get("p50") or tbt.get("p99", 0) < STALL_TAIL * tbt["p50"]:
        return []
    head = f"TBT p99 is {tbt['p99'] / tbt['p50']:.0f}x its median: "
    budget = dep.settings.max_num_batched_tokens
    opt = stall_option(dep.profile)
    if opt is None:  # chunks already share the decodes' steps: a smaller chunk stalls less
        if dep.profile.scheduler.prefill_first:  # a prefill-first engine without the option
            return []
        return [f"{head}each step carries up to {budget} prompt tokens beside the running "
                "decodes; a smaller token budget splits the prompts over more, shorter steps "
                "(--max-num-batched-tokens N, N at least --max-num-seqs; TTFT grows)"]
    flag, spec = dep.profile.option_flags[opt], f"{dep.profile.spec}+{opt}"
    if dep.profile.scheduler.prefill_first:  # the decodes wait while a prompt chunk runs
        return [f"{head}{dep.profile.name}'s default stops the running decodes for each "
                f"prompt's work; {flag} shares the steps instead (--engine {spec})"]
    # whole prompts ride in the decodes' step: chunking splits them only below the budget
    return [f"{head}{dep.profile.name}'s default runs each prompt whole in one step beside the "
            f"running decodes; {flag} with a token budget below the prompts (now {budget}) "
            f"splits it over steps (--engine {spec} --max-num-batched-tokens N, N at least "
            "--max-num-seqs)"]


STALL_TAIL = 3.0
"""A TBT p99 this many times its median is read as decodes stopped by prompt work."""


AT_CAP = 0.9
"""A mean running batch this share of the cap on sequences beside a prompt or more is read as
held at it (a mean is below its maximum while the batch fills and drains)."""


def whole_prompt_warning(dep: Deployment, prompt: float, running: float) -> str | None:
    """Say so when prompts wait for running decodes to leave room in the token budget
    (SchedulerPolicy.decodes_beside_prompt): the replica runs at most that many sequences
    beside a P-token prompt, and `running` (its mean running batch; inf when the queue is
    overloaded at that cap) reached it."""
    s = dep.settings
    beside = dep.profile.scheduler.decodes_beside_prompt(s.max_num_batched_tokens, prompt)
    if beside is None or beside + 1 >= s.max_num_seqs or running < AT_CAP * (beside + 1):
        return None
    flag = dep.profile.flag_names.get("max_num_batched_tokens")
    engine_flag = f" ({dep.profile.name}: {flag})" if flag else ""
    return (f"{dep.profile.name} prefills each prompt whole in a step with the running "
            f"decodes, within the token budget {s.max_num_batched_tokens}: a {prompt:.0f}-token "
            f"prompt joins at most {beside:.0f} running sequences, so prompts wait for decodes "
            f"to finish; --max-num-batched-tokens{engine_flag} "
            f"{math.ceil(prompt) + s.max_num_seqs} (prompt + max_num_seqs) lets every prompt "
            "join")


LORA_SLOT_REASON = ("the analytic queue does not model a request's wait for its LoRA "
                    "adapter's slot")
"""Why the analytic queue does not answer a load whose LoRA slots are fewer than its adapters."""


def lora_slot_warning(dep: Deployment) -> str | None:
    """Say so when the traffic has more LoRA adapters than the replica has slots: vLLM
    (vllm/v1/core/sched/scheduler.py `Scheduler.schedule`) runs at most max_loras adapters at
    once and skips a waiting request of any other until a running adapter has no running
    request; the replay runs that rule (capplan.sim.compiled), the analytic queue does not."""
    s = dep.settings
    if not slot_shortfall(s):
        return None
    adapters = s.lora_adapters or s.max_loras
    return (f"max_loras {s.max_loras} < {adapters} {s.lora_popularity} adapters: a request "
            "whose adapter has no slot waits until a running adapter has no running request "
            "(vLLM skips it meanwhile and fills the batch with requests of the loaded "
            "adapters), so the replay answers; --max-loras "
            f"{adapters} removes the wait")


def _add_trace(res: dict[str, Any], tr: dict[str, Any]) -> None:
    """A trace's windows into `res`; the load line names the file, its columns and time unit."""
    res["load"] = next((n for n in res["notes"] if n.startswith("trace ")), res["load"])
    res["notes"] = [n for n in res["notes"] if n != res["load"]]
    res["trace"] = tr
    if tr.get("varies"):
        res["warnings"].append(varying_rate_warning(tr))


def _replayed(dep: Deployment, load: ReplayLoad, run: dict[str, Any]) -> dict[str, Any]:
    """`latency`'s result from one replay run (before the trace's windows and the screen)."""
    sim = run["results"]["continuous"]
    head = run["head"]
    res: dict[str, Any] = {
        "model": head["model"], "gpu": head["gpu"], "tp": head["tp"], "stable": True,
        **{k: sim[k] for k in LATENCY_KEYS if k in sim},
        "preemptions": float(sim["preemptions"]),
        "bound": head["bound"], "calibration": head["calibration"],
        "engine": dep.profile.label, "engine_settings": head["engine_settings"],
        "answered_by": "replay", "tolerance": TOLERANCE, "notes": list(run["notes"]),
        "warnings": [], "load": _load_text(load, sim),
    }
    if sim.get("prefix_hit_tokens"):  # the prompt tokens the replay found in the prefix cache
        res["prefix_hit_tokens"] = sim["prefix_hit_tokens"]
        res["cached_tokens_per_request"] = sim["prefix_hit_tokens"] / max(sim["num_requests"], 1)
    if sim.get("benchmark") and load.benchmark is not None:
        res["notes"].append(benchmark_note(sim["benchmark"]))
    if sim.get("overloaded"):
        _unstable_replay(res, sim)
    return res


def drain_note(sim: dict[str, Any], rate: float) -> str:
    """What a replay's throughput is: completed requests over the whole run, from the first
    arrival to the last completion, so the drain after the last arrival counts, as in `vllm
    bench serve`'s request throughput (completed / benchmark duration, the clock stopped when
    every request has finished: vllm/benchmarks/serve.py). A stable open loop therefore
    reports a little less than the rate it was offered."""
    return (f"throughput is completed requests over the whole run, the drain after the last "
            f"arrival included, as vllm bench serve reports it: {sim['requests_per_s']:.4g} "
            f"req/s = {sim['num_requests']} requests / {sim['makespan_s']:.4g} s, at "
            f"{rate:g} req/s offered")


UNSTABLE_NULLS = ("ttft_s", "tbt_s", "e2e_s", "tpot_s", "queue_s", "output_tokens_per_s",
                  "input_tokens_per_s", "requests_per_s", "mean_running_batch",
                  "kv_peak_utilization")
"""The figures an overloaded replay does not report (they grow with the run's length)."""


def _unstable_replay(res: dict[str, Any], sim: dict[str, Any]) -> None:
    """An open-loop replay whose backlog grew through its arrivals (capplan.sim.stability):
    reported unstable as the analytic queue's overload is, with the rate it served while
    requests arrived as its capacity."""
    win = sim["arrival_window"]
    res.update({k: None for k in UNSTABLE_NULLS if k in res})
    res.update(stable=False, offered_requests_per_s=sim["offered_requests_per_s"],
               capacity_requests_per_s=win["served_requests_per_s"],
               reason=(f"the replay's queue grows at {sim['offered_requests_per_s']:.3g} "
                       f"req/s offered: it served {win['served_requests_per_s']:.3g} req/s "
                       "while requests arrived"))


def _overloaded(ana: dict[str, Any]) -> dict[str, Any]:
    """A rate above the analytic capacity: reported unstable, not replayed (a finite replay of
    an overloaded queue has no steady state to report, and costs the most to run)."""
    out = {**ana, "answered_by": "analytic", "tolerance": TOLERANCE, "warnings": [],
           "notes": ["answered by: analytic queue (the rate exceeds its capacity; not replayed: "
                     "`capplan simulate` shows how the queue grows)"]}
    return out


def _screen(ana: dict[str, Any], res: dict[str, Any], reason: str | None = None
            ) -> dict[str, Any]:
    """Open loop: the analytic answer where it agrees with the replay (CHECKED within
    TOLERANCE), else the replay's; both figures kept under `analytic_check`. `reason`: why the
    analytic queue may not answer this load whatever the figures (`analytic_check.reason`)."""
    diffs = {f"{k}.{q}": rel_diff(float(ana[k][q]), float(res[k][q])) for k, q in CHECKED}
    agree = all(d <= SCREEN_TOLERANCE for d in diffs.values()) and reason is None
    replayed = {k: res[k] for k in ("ttft_s", "tbt_s", "e2e_s", "requests_per_s")}
    check = {"agrees": agree, "relative_difference": diffs,
             "analytic": {k: ana[k] for k in ("ttft_s", "tbt_s", "e2e_s")}, "replay": replayed}
    if reason is not None:
        check["reason"] = reason
    keep = {"notes": res["notes"], "warnings": res["warnings"], "tolerance": TOLERANCE,
            "engine_impl": res.get("engine_impl"), "num_requests": res.get("num_requests"),
            "analytic_check": check}
    if not agree:
        return {**res, "analytic_check": check}
    return {**ana, **keep, "answered_by": "analytic"}


def _load_text(load: ReplayLoad, sim: dict[str, Any]) -> str:
    b = sim.get("benchmark")
    if load.concurrency is not None:
        w = ""
        if b and b["warmup_prompts"]:
            w = (f" after {b['warmup_prompts']} warm-ups" + (" (drained)" if
                                                             b.get("warmup_drained") else ""))
        tool = f" ({b['tool']})" if b else ""
        return (f"closed loop, {load.concurrency} clients, {sim['num_requests']} measured "
                f"requests{w}{tool}")
    if load.trace is not None:
        return f"trace {load.trace}"
    return f"open loop, {load.rate:g} req/s" + (f" ({b['tool']})" if b else "")


def answered_note(res: dict[str, Any]) -> str:
    """The footer line naming the model that answered."""
    if res["answered_by"] == "analytic":
        worst = max(res["analytic_check"]["relative_difference"].values())
        return (f"answered by: analytic queue (within {worst:.0%} of the replay on TTFT and "
                f"TBT mean/p99; screen tolerance {SCREEN_TOLERANCE:.0%})")
    why = ""
    chk = res.get("analytic_check")
    if chk is not None and chk.get("reason"):
        why = f"; {chk['reason']}"
    elif chk is not None:
        key, worst = max(chk["relative_difference"].items(), key=lambda kv: kv[1])
        name = key.replace("_s", "")
        why = (f"; the analytic queue differs by {worst:.0%} on {name}" if math.isfinite(worst)
               else f"; the analytic queue and the replay disagree on whether {name} exists")
    return (f"answered by: replay (simulator, {res.get('engine_impl', 'reference')} engine, "
            f"{res.get('num_requests')} requests{why})")


def trace_windows(load: ReplayLoad, trace: Any = None) -> dict[str, Any]:
    """What was read from a trace (rows, span, mean rate) and its rate per `window_s` window:
    `varies` when the peak window's rate exceeds the trace's mean rate (sim.workload
    arrival_rate: its n - 1 gaps over its span, `mean_rate_per_s`, as the load line gives it)
    by more than TOLERANCE. The windows are the day planner's (rate_curve.trace_window_edges):
    a final tail of half a window or more is a window of its own, rated over its real length,
    a shorter one joins the window before; a trace of one window has none to compare."""
    from capplan.plan.rate_curve import trace_window_edges
    from capplan.sim.workload import load_trace, replayable_rate

    t = trace if trace is not None else load_trace(load.trace, load.time_unit)
    arr = np.sort(np.asarray(t.arrival_at_s, float))
    mean = replayable_rate(arr, str(load.trace))
    out: dict[str, Any] = {"path": str(load.trace), "rows": len(arr),
                           "span_s": float(arr[-1] - arr[0]), "mean_rate_per_s": mean,
                           "window_s": load.window_s, "windows": [], "varies": False}
    edges, counts = trace_window_edges(arr - arr[0], load.window_s)
    if len(counts) < 2:
        return out
    rates = counts / np.diff(edges)
    i = int(np.argmax(rates))
    out["windows"] = [{"start_s": float(edges[j]), "end_s": float(edges[j + 1]),
                       "rate_per_s": float(rates[j])} for j in range(len(rates))]
    out["peak_window"] = dict(out["windows"][i])
    out["varies"] = bool(rates[i] > (1 + TOLERANCE) * mean)
    return out


def varying_rate_warning(tr: dict[str, Any]) -> str:
    p = tr["peak_window"]
    mean = tr["mean_rate_per_s"]  # requests over the trace's span, as the load line says
    return (f"the trace's rate varies across {tr['window_s'] / 60:g}-min windows: peak "
            f"{p['rate_per_s']:.3g} req/s in the window at {p['start_s'] / 3600:.2f} h, "
            f"{p['rate_per_s'] / mean - 1:.0%} above the mean {mean:.3g} req/s; this is one "
            "replica's replay of the whole trace: size a fleet per window with "
            "`capplan recommend --trace`")


def benchmark_note(b: dict[str, Any]) -> str:
    """The tool's own figures, as it would print them (ms)."""
    m = b["metrics"]
    parts = ", ".join(f"{name} mean {m[k]['mean'] * 1e3:.1f} / p99 {m[k]['p99'] * 1e3:.1f} ms"
                      for k, name in (("ttft_s", "TTFT"), ("tpot_s", "TPOT"), ("itl_s", "ITL")))
    warm = (f", {b['warmup_prompts']} warm-ups drained first" if b.get("warmup_drained")
            and b["warmup_prompts"] else "")
    return (f"as {b['tool']} reports it ({b['num_prompts']} measured requests{warm}): "
            f"{parts}")
