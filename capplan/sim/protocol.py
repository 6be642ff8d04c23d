"""Benchmark protocols as the tools users run them, replayable by the simulator.

A prediction is compared with a benchmark only like for like: the same requests (lengths,
warm-ups, measured requests), the same client behaviour (closed-loop clients starting together,
or an arrival rate) and the same metric definitions (TPOT with or without the first token, ITL
as every gap or as a per-request mean). A `BenchmarkPreset` writes those down for one tool, with
the source each value was read from; `measure` turns a replayed run into that tool's report.

Metric definitions (per request; E2E from the request's send to its last token):
- `vllm bench serve` (vllm/benchmarks/serve.py, `calculate_metrics`) and SGLang
  `bench_serving` (python/sglang/bench_serving.py): TPOT = (E2E - TTFT) / (output - 1), the
  first token excluded; ITL = every gap between consecutive streamed tokens, pooled.
- AIPerf / genai-perf (aiperf/metrics/types/inter_token_latency_metric.py): "inter token
  latency" = (request latency - TTFT) / (output - 1) per request, i.e. vLLM's TPOT; there is no
  pooled gap metric of that name.
- GuideLLM (src/guidellm/schemas/request_stats.py): time_per_output_token_ms = (last token -
  request start) / output tokens, the first token INCLUDED; inter_token_latency_ms = (last
  token - first token) / (output - 1), vLLM's TPOT.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from capplan.errors import InputError
from capplan.sim.entities import RunRecord
from capplan.sim.metrics import summarize, summary
from capplan.sim.workload import Lane

TPOT_EXCL_FIRST = "excl_first"
"""TPOT = (E2E - TTFT) / (output - 1) per request."""
TPOT_INCL_FIRST = "incl_first"
"""TPOT = E2E / output per request (the first token's wait included)."""
ITL_GAPS = "gaps"
"""ITL = every gap between consecutive tokens, pooled over requests (= capplan's TBT)."""
ITL_PER_REQUEST = "per_request"
"""ITL = (E2E - TTFT) / (output - 1) per request."""


@dataclass(frozen=True, kw_only=True)
class BenchmarkPreset:
    """How one benchmark tool runs a load and what it reports (module docstring)."""

    name: str
    tool: str
    source: str
    """Where the values were read (file in the tool's repository, or its documented command)."""
    num_prompts: int | None = None
    """Measured requests, fixed; None: `prompts_per_client` x concurrency, else the run's own
    count (--num-prompts; 1000 by default, the default of vllm bench serve and SGLang
    bench_serving)."""
    prompts_per_client: float | None = None
    warmup_per_client: float = 0.0
    """Warm-up requests per client, sent first and not measured."""
    warmup_fixed: int = 0
    """Warm-up requests, fixed (added to warmup_per_client x C)."""
    range_ratio: float = 1.0
    """Random lengths: uniform integers in [max(floor(r L), 1), L] (SGLang bench_serving's and
    vLLM's benchmark_serving.py `sample_random_requests`); 1 = fixed lengths."""
    tpot: str = TPOT_EXCL_FIRST
    itl: str = ITL_GAPS
    warmup_drained: bool = True
    """The tool waits for every warm-up response before the measured requests start, all
    clients together again (vllm bench serve: `asyncio.gather` of the warm-up tasks, then the
    main run; AIPerf: "waits indefinitely for all warmup responses before starting
    profiling", docs/tutorials/warmup.md): the measured run has its own start-up wave, and the
    warm-ups (which only warm a real server's caches and kernels) change nothing the replay
    computes."""

    def prompts(self, concurrency: int | None, default: int) -> int:
        """Measured requests of a run with `concurrency` clients (open loop: None)."""
        if self.prompts_per_client is not None and concurrency is not None:
            return max(int(math.ceil(self.prompts_per_client * concurrency)), 1)
        return self.num_prompts or default

    def warmups(self, concurrency: int | None) -> int:
        return int(math.ceil(self.warmup_per_client * (concurrency or 0))) + self.warmup_fixed

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "tool": self.tool, "source": self.source,
                "range_ratio": self.range_ratio, "tpot": self.tpot, "itl": self.itl,
                "clients_start_together": True}


PRESETS: dict[str, BenchmarkPreset] = {p.name: p for p in (
    # vllm/benchmarks/serve.py (`vllm bench serve`): --num-prompts 1000, --num-warmups 0,
    # --random-range-ratio 0.0 (lengths in [L(1-r), L(1+r)]: fixed), --request-rate inf with
    # --max-concurrency: every client sends at t = 0
    BenchmarkPreset(name="vllm", tool="vllm bench serve",
                    source="vllm/benchmarks/serve.py (--num-prompts 1000, --num-warmups 0, "
                           "--random-range-ratio 0.0)"),
    # python/sglang/bench_serving.py: --num-prompts 1000, --warmup-requests 1,
    # --random-range-ratio 0.0 (input lengths uniform in [1, L], output in [0, L] -> >= 1)
    BenchmarkPreset(name="sglang", tool="SGLang bench_serving", warmup_fixed=1,
                    range_ratio=0.0,
                    source="sglang python/sglang/bench_serving.py (--num-prompts 1000, "
                           "--warmup-requests 1, --random-range-ratio 0.0)"),
    # genai-perf / AIPerf as NVIDIA's serving recipes run it (ai-dynamo benchmarks perf.sh):
    # --request-count 10 x C, --warmup-request-count 2 x C, fixed lengths (stddev 0,
    # ignore_eos); ITL is the per-request mean (aiperf inter_token_latency_metric.py)
    BenchmarkPreset(name="aiperf", tool="AIPerf / genai-perf", prompts_per_client=10.0,
                    warmup_per_client=2.0, itl=ITL_PER_REQUEST,
                    source="aiperf profile --concurrency C --request-count 10C "
                           "--warmup-request-count 2C (ai-dynamo benchmark recipes); "
                           "aiperf/metrics/types/inter_token_latency_metric.py"),
    # GuideLLM concurrent profile: src/guidellm/schemas/request_stats.py for the metrics
    # (TPOT includes the first token; ITL excludes it); no warm-up by default
    BenchmarkPreset(name="guidellm", tool="GuideLLM", tpot=TPOT_INCL_FIRST,
                    itl=ITL_PER_REQUEST,
                    source="guidellm src/guidellm/schemas/request_stats.py "
                           "(time_per_output_token_ms, inter_token_latency_ms)"),
    # SemiAnalysis InferenceX benchmarks/benchmark_lib.sh: --num-prompts 10 x C,
    # --num-warmups 2 x C, --random-range-ratio 0.8 (benchmark_serving.py: [0.8 L, L]),
    # --request-rate inf --ignore-eos
    BenchmarkPreset(name="inferencex", tool="InferenceX (SemiAnalysis)", prompts_per_client=10.0,
                    warmup_per_client=2.0, range_ratio=0.8,
                    source="SemiAnalysisAI/InferenceX benchmarks/benchmark_lib.sh "
                           "(--num-prompts 10C, --num-warmups 2C, --random-range-ratio 0.8)"),
)}


def preset(name: str) -> BenchmarkPreset:
    """The preset called `name` (InputError naming the choices)."""
    try:
        return PRESETS[name.strip().lower()]
    except KeyError:
        raise InputError(f"--benchmark {name!r}: expected one of {', '.join(PRESETS)}") from None


def length_spec(nominal: float, range_ratio: float) -> str:
    """The length option a preset's random dataset draws from: the nominal length when fixed,
    else uniform integers in [max(floor(r L), 1), L]."""
    if range_ratio >= 1.0:
        return str(int(round(nominal)))
    lo = max(int(nominal * range_ratio), 1)
    return f"uniform:min={lo},max={int(round(nominal))}"


def measured_record(r: RunRecord, warmups: int) -> RunRecord:
    """The run as the benchmark measures it: the first `warmups` requests (a closed loop sends
    requests in index order) dropped; per-step samples (TBT gaps, running, KV) kept from the
    first measured request's arrival. Gaps listed one by one (`extra_gaps_s`, after a
    preemption) carry no time and are all kept."""
    if warmups <= 0:
        return r
    w = min(warmups, len(r.arrival_at_s) - 1)
    t0 = float(r.arrival_at_s[w:].min())
    keep = r.step_start_s >= t0
    per = {k: getattr(r, k)[w:] for k in ("arrival_at_s", "admitted_at_s", "first_token_at_s",
                                           "finished_at_s", "input_tokens", "output_tokens",
                                           "lane")}
    steps = {k: getattr(r, k)[keep] if len(getattr(r, k)) == len(keep) else getattr(r, k)
             for k in ("step_start_s", "step_dur_s", "step_tbt_count", "step_tbt_gap_s",
                       "step_running", "step_waiting", "step_kv_blocks")}
    return replace(r, **per, **steps)


def request_tpot(ttft_s: np.ndarray, e2e_s: np.ndarray, output_tokens: np.ndarray,
                 definition: str | None = TPOT_EXCL_FIRST) -> np.ndarray:
    """Each request's TPOT as a tool defines it: (E2E - TTFT) / (output - 1), the first token
    excluded (NaN for a one-token output), or E2E / output with TPOT_INCL_FIRST."""
    out = np.asarray(output_tokens, float)
    if definition == TPOT_INCL_FIRST:
        return e2e_s / np.maximum(out, 1.0)
    return np.where(out > 1, (e2e_s - ttft_s) / np.maximum(out - 1, 1.0), np.nan)


def benchmark_metrics(r: RunRecord, p: BenchmarkPreset, overhead_s: float,
                      tbt: dict[str, float]) -> dict[str, Any]:
    """The tool's TTFT, TPOT and ITL (each {mean, p50, p90, p99}, s) of a measured run;
    `overhead_s` is the client-side cost added to TTFT and E2E (what the client measures);
    `tbt` the pooled token gaps (ITL as vLLM defines it)."""
    ttft = r.first_token_at_s - r.arrival_at_s + overhead_s
    e2e = r.finished_at_s - r.arrival_at_s + overhead_s
    excl = request_tpot(ttft, e2e, r.output_tokens)
    excl = excl[r.output_tokens > 1]
    tpot = excl if p.tpot == TPOT_EXCL_FIRST else request_tpot(ttft, e2e, r.output_tokens,
                                                                 TPOT_INCL_FIRST)
    itl = tbt if p.itl == ITL_GAPS else summary(excl)
    return {"ttft_s": summary(ttft), "tpot_s": summary(tpot), "itl_s": itl}


def measure(p: BenchmarkPreset, warmups: int, overhead_s: float,
            info: dict[str, Any] | None = None):  # noqa: ANN201
    """A `run_scheduler(measure=...)` hook: the replay summarised as the tool reports it (the
    SimResult of the requests after the first `warmups`, with the tool's metrics and `info`
    under `benchmark`)."""
    def run(r: RunRecord, lanes: tuple[Lane, ...]) -> Any:
        m = measured_record(r, warmups)
        res = summarize(m, lanes)
        extra = {**p.describe(), "num_prompts": len(m.arrival_at_s), "warmup_prompts": warmups,
                 **(info or {}), "metrics": benchmark_metrics(m, p, overhead_s, res.tbt_s)}
        return _WithBenchmark(res, extra)
    return run


@dataclass(frozen=True)
class _WithBenchmark:
    """A SimResult and the benchmark block its `to_dict` adds."""

    res: Any
    benchmark: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {**self.res.to_dict(), "benchmark": self.benchmark}


def reported_ttft(overhead_s: Any, wave_s: Any, steady_s: Any, rounds: float) -> Any:
    """The analytic closed loop's benchmark-mean TTFT over `rounds` measured requests per client:
    one start-up wave (all clients sent together), the rest steady (docs/queueing.md, "What the
    benchmark reports"); floats or arrays. The replay needs no such formula: it measures."""
    w = 1.0 / max(rounds, 1.0)
    return overhead_s + w * (wave_s - overhead_s) + (1 - w) * (steady_s - overhead_s)


AIC_MARGIN_TOKENS = 1500
"""The tokens AIConfigurator's benchmark rules add to a worker's lengths (generator
rule_plugin/benchmark/{vllm,sglang,trtllm}.rule: `SlaConfig.isl + 1500` and `isl + osl + 1500`)."""


def aiconfigurator_settings(backend: str, isl: int, osl: int, batch_size: int,
                            concurrency: int, attention_dp: int = 1) -> dict[str, Any]:
    """The engine settings AIConfigurator's benchmark generator gives an `agg` worker
    (github:ai-dynamo/aiconfigurator src/aiconfigurator/generator/rule_plugin/benchmark/
    {vllm,sglang,trtllm}.rule @2b264ba/043c66c/581e459): running-request cap = batch_size
    (vLLM max_num_seqs, SGLang max_running_requests, TensorRT-LLM max_batch_size), per engine
    (attention-DP rank); per-step tokens = batch_size + ISL + 1500 for vLLM and TensorRT-LLM
    (TensorRT-LLM rounded up to its 32-token blocks); max_model_len = ISL + OSL + 1500. SGLang:
    max_prefill_tokens = ISL + 1500 (`max_prefill_tokens`, the prompt budget a step's further
    prompts are admitted within whole, SchedulerPolicy.whole_prompts_after_first) with
    chunked_prefill_size left at SGLang's GPU-memory-tier default (no max_num_batched_tokens
    here: the profile's defaults_rule gives it), and enable_mixed_chunk (`mixed_prefill`:
    prefill chunks ride with the decode batch)."""
    seqs = max(int(batch_size or 0), -(-int(concurrency) // max(int(attention_dp), 1)))
    prefill = isl + AIC_MARGIN_TOKENS
    tokens = seqs + prefill
    if backend == "trtllm":  # maxNumTokens % tokensPerBlock (32) == 0 (trtllm.rule)
        tokens = -(-tokens // 32) * 32
    sglang = backend == "sglang"
    opts = {"max_num_seqs": seqs, "max_num_batched_tokens": None if sglang else tokens,
            "max_model_len": isl + osl + AIC_MARGIN_TOKENS}
    return {"options": opts, "mixed_prefill": sglang,
            "max_prefill_tokens": prefill if sglang else None}



@dataclass(frozen=True)
class BenchmarkRun:
    """A preset applied to one run: how many requests it measures and warms up with, and
    whether the warm-ups are drained before the measured requests start (the tools' way,
    `BenchmarkPreset.warmup_drained`) or lead into them in one continuing loop (the first
    `warmups` requests of the run go unmeasured: `latency --warmup-prompts`)."""

    preset: BenchmarkPreset
    measured: int
    warmups: int
    drained: bool = True

    @classmethod
    def of(cls, p: BenchmarkPreset, concurrency: int | None, num_prompts: int | None = None,
           warmup_prompts: int | None = None, default: int = 1000) -> BenchmarkRun:
        """`num_prompts` replaces the preset's measured count; `warmup_prompts`, when given,
        its warm-ups, sent in the same loop as the measured requests (not drained)."""
        n = num_prompts or p.prompts(concurrency, default)
        if warmup_prompts is None:
            return cls(p, int(n), p.warmups(concurrency), p.warmup_drained)
        return cls(p, int(n), int(warmup_prompts), False)

    @property
    def sent_warmups(self) -> int:
        """Warm-ups the replay sends before the measured requests (none when drained)."""
        return 0 if self.drained else self.warmups

    def workload(self, input_len: str, output_len: str) -> tuple[int, str, str]:
        """(requests to send, input length, output length): warm-ups first; a fixed nominal
        length becomes the tool's random range (distributions are kept as given)."""
        def spec(text: str) -> str:
            try:
                return length_spec(float(text), self.preset.range_ratio)
            except ValueError:
                return text
        return self.measured + self.sent_warmups, spec(str(input_len)), spec(str(output_len))

    def measure(self, overhead_s: float):  # noqa: ANN201
        """The `run_scheduler(measure=...)` hook of this run."""
        return measure(self.preset, self.sent_warmups, overhead_s,
                       {"warmup_prompts": self.warmups, "warmup_drained": self.drained})
