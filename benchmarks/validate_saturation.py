"""Open-loop saturation against published throughput plateaus (docs/validation.md, section 4c).

Run: .venv/bin/python benchmarks/validate_saturation.py [--write-docs]

Each point is a published run that sent a whole ShareGPT sample at once (`--request-rate inf`)
and reports the request throughput it sustained: the plateau an open loop saturates at. For each
one capplan is asked as a user would ask it, under each profile that can stand for the release
measured:
- `capplan latency --rate R` at the sample's mean lengths: the highest R it answers as stable
  (bisected on its verdict), and the capacity its UNSTABLE message prints;
- `capplan simulate`: the benchmark replayed, all requests arriving at once (requests /
  makespan), at the mean lengths and with the lengths bench_serving samples (5,000 ShareGPT
  (prompt, reply) pairs, benchmarks/data/sharegpt_llama31_lengths.csv, made by
  benchmarks/sharegpt_lengths.py).
The same source's online runs (Poisson at 4 and 8 req/s) are replayed too, with the same
lengths: their median TPOT tests the step costs at the batches those loads reach.
Nothing here is fitted to these figures; every point is printed, the bad ones too.
"""

from __future__ import annotations

import csv
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from docblocks import ROOT, write_block  # benchmarks/ is on sys.path when run as a script

from capplan import api

DOC = ROOT / "docs" / "validation.md"

SGLANG_060 = ("https://github.com/sgl-project/sglang/blob/main/benchmark/benchmark_vllm_060/"
              "README.md")
"""SGLang v0.3.0 against vLLM v0.6.0, "Offline benchmark results": `python3 -m
sglang.bench_serving --backend {sglang,vllm} --dataset-name sharegpt --num-prompts 5000`
(request rate inf). vLLM served with `--num-scheduler-steps 10 --max_model_len 4096`; SGLang
with `--disable-radix-cache` (8B also `--enable-torch-compile`, 70B `--mem-frac 0.88`).
"Online benchmark results": the same clients with `--request-rate 4 --num-prompts 1200` and
`--request-rate 8 --num-prompts 2400` (SGLang 70B at its default memory fraction)."""

SHAREGPT_INPUT_MEAN = 453502 / 2000
"""Mean prompt tokens of bench_serving's ShareGPT sample: 453,502 input tokens over 2,000
prompts (same sampler and seed, Llama-3.1 tokenizer), github.com/sgl-project/sglang/issues/1639
(comment of 2024-10-17). The 5,000-prompt runs do not print their input total."""

SHAREGPT = ROOT / "benchmarks" / "data" / "sharegpt_llama31_lengths.csv"
"""(prompt, reply) token lengths that pass bench_serving's ShareGPT filter (Llama-3.1
tokenizer), from the first 17,671 conversations of ShareGPT_V3_unfiltered_cleaned_split.json
(benchmarks/sharegpt_lengths.py)."""
SAMPLE_SEED = 1

NUM_PROMPTS = 5000
INF_RATE = 1e6
"""`--request-rate inf` as a simulated arrival rate: the 5,000 requests arrive within 5 ms."""


@dataclass(frozen=True)
class Point:
    model: str
    gpu: str
    tp: int
    engine: str
    """What was measured (engine and release)."""
    profiles: tuple[str, ...]
    """capplan's profiles for it: the release's own first, then later ones."""
    req_s: float
    out_tok_s: float
    source: str
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def output_mean(self) -> float:
        """Mean output tokens: the source's output tok/s over its req/s (same run)."""
        return self.out_tok_s / self.req_s


VLLM_PROFILES = ("vllm@0.6", "vllm@0.11", "vllm@0.14")
SGLANG_PROFILES = ("sglang@0.3", "sglang@0.4")
VLLM_OPTS = {"max_model_len": 4096}

POINTS = (
    Point("llama-3.1-8b", "a100-sxm", 1, "vLLM 0.6.0", VLLM_PROFILES, 21.27, 4132.37,
          SGLANG_060, VLLM_OPTS),
    Point("llama-3.1-8b", "a100-sxm", 1, "SGLang 0.3.0", SGLANG_PROFILES, 22.03, 4281.51,
          SGLANG_060),
    Point("llama-3.1-70b", "h100-sxm", 4, "vLLM 0.6.0", VLLM_PROFILES, 19.04, 3700.64,
          SGLANG_060, VLLM_OPTS),
    Point("llama-3.1-70b", "h100-sxm", 4, "SGLang 0.3.0", SGLANG_PROFILES, 19.84, 3856.01,
          SGLANG_060, {"gpu_memory_utilization": 0.88}),
)


@dataclass(frozen=True)
class Online:
    """A published online run: Poisson arrivals at `rate`, medians in ms."""

    model: str
    gpu: str
    tp: int
    engine: str
    rate: float
    prompts: int
    e2e_ms: float
    ttft_ms: float
    tpot_ms: float


ONLINE = tuple(
    Online(m, g, tp, e, r, n, e2e, ttft, tpot)
    for (m, g, tp), runs in {
        ("llama-3.1-8b", "a100-sxm", 1): (
            ("SGLang 0.3.0", 4, 1200, 1564.17, 31.98, 13.17),
            ("vLLM 0.6.0", 4, 1200, 1691.97, 100.48, 14.14),
            ("SGLang 0.3.0", 8, 2400, 2175.02, 35.68, 17.85),
            ("vLLM 0.6.0", 8, 2400, 2137.16, 120.39, 17.09)),
        ("llama-3.1-70b", "h100-sxm", 4): (
            ("SGLang 0.3.0", 4, 1200, 3005.24, 53.94, 25.03),
            ("vLLM 0.6.0", 4, 1200, 2915.60, 179.15, 23.58),
            ("SGLang 0.3.0", 8, 2400, 4064.98, 58.11, 33.07),
            ("vLLM 0.6.0", 8, 2400, 3752.38, 207.12, 29.15)),
    }.items() for e, r, n, e2e, ttft, tpot in runs)
ONLINE_PROFILES = {"vLLM 0.6.0": ("vllm@0.6",),
                   "SGLang 0.3.0": ("sglang@0.3", "sglang@0.4")}


def sharegpt_pairs() -> np.ndarray:
    """Every (prompt, reply) length pair of the ShareGPT file, shape (n, 2)."""
    with SHAREGPT.open() as f:
        rows = list(csv.reader(f))[1:]
    return np.asarray(rows, dtype=np.int64)


def write_trace(path: Path, n: int, rate: float | None, seed: int = SAMPLE_SEED) -> Path:
    """A trace of n pairs drawn without replacement (bench_serving samples distinct
    conversations), all at t = 0 (`rate` None: --request-rate inf) or with exponential gaps
    of mean 1/rate from t = 0 (bench_serving's Poisson arrivals)."""
    rng = np.random.default_rng(seed)
    pairs = sharegpt_pairs()
    pick = pairs[rng.choice(len(pairs), size=n, replace=False)]
    t = (np.zeros(n) if rate is None
         else np.concatenate([[0.0], np.cumsum(rng.exponential(1 / rate, n - 1))]))
    path.write_text("arrival_time_s,input_tokens,output_tokens\n" + "".join(
        f"{a:.6f},{i},{o}\n" for a, (i, o) in zip(t, pick, strict=True)))
    return path


def _opts(p: Point | Online) -> dict[str, Any]:
    return dict(p.options) if isinstance(p, Point) else (
        VLLM_OPTS if p.engine.startswith("vLLM") else {})


def _latency(p: Point, profile: str, rate: float) -> dict[str, Any]:
    return api.latency(p.model, p.gpu, rate=rate, input_len=round(SHAREGPT_INPUT_MEAN),
                       output_len=round(p.output_mean), engine=profile, tp=p.tp,
                       **p.options).data


def highest_stable_rate(p: Point, profile: str, rel: float = 0.005
                        ) -> tuple[float, float | None]:
    """The highest rate `capplan latency --rate` answers as stable (bisection to `rel`), and
    the capacity its first UNSTABLE answer prints."""
    lo, hi, printed = 0.0, 1.0, None
    while (d := _latency(p, profile, hi))["stable"]:
        lo, hi = hi, hi * 2
    printed = d.get("capacity_requests_per_s")
    while hi - lo > rel * hi:
        mid = (lo + hi) / 2
        if _latency(p, profile, mid)["stable"]:
            lo = mid
        else:
            hi = mid
    return lo, printed


def replayed_rate(p: Point, profile: str, trace: Path | None = None) -> float:
    """The benchmark replayed: NUM_PROMPTS requests at once; completed requests / makespan.
    At the mean lengths, or with the trace's lengths."""
    if trace is None:
        d = api.simulate(p.model, p.gpu, rate=INF_RATE, requests=NUM_PROMPTS,
                         input_len=round(SHAREGPT_INPUT_MEAN), output_len=round(p.output_mean),
                         engine=profile, tp=p.tp, **p.options).data
    else:
        d = api.simulate(p.model, p.gpu, trace=str(trace), engine=profile, tp=p.tp,
                         **p.options).data
    return float(d["requests_per_s"])


def _err(pred: float, meas: float) -> str:
    return f"{pred / meas - 1:+.0%}"


def rows() -> list[tuple[Point, str, float, float | None, float, float]]:
    with tempfile.TemporaryDirectory() as tmp:
        trace = write_trace(Path(tmp) / "inf.csv", NUM_PROMPTS, None)
        return [(p, prof, *highest_stable_rate(p, prof), replayed_rate(p, prof),
                 replayed_rate(p, prof, trace)) for p in POINTS for prof in p.profiles]


def sample_note() -> str:
    with tempfile.TemporaryDirectory() as tmp:
        trace = write_trace(Path(tmp) / "inf.csv", NUM_PROMPTS, None)
        with trace.open() as f:
            x = np.asarray([r[1:] for r in list(csv.reader(f))[1:]], dtype=np.int64)
    return (f"ShareGPT sample: {len(x)} of {len(sharegpt_pairs())} pairs, mean input "
            f"{x[:, 0].mean():.1f} / output {x[:, 1].mean():.1f} tokens, longest output "
            f"{x[:, 1].max()}")


def saturation_table() -> str:
    head = ("| model | GPUs | measured on | capplan profile | measured req/s (output tok/s) | "
            "`latency --rate`: highest stable req/s | its printed capacity | "
            "`simulate` replay at the means | `simulate` replay, ShareGPT lengths |\n"
            "|---|---|---|---|---|---|---|---|---|\n")
    body = []
    for p, prof, stable, printed, replay, dist in rows():
        cap = f"{printed:.1f} ({_err(printed, p.req_s)})" if printed else "-"
        body.append(f"| {p.model} | {p.tp}x {p.gpu} (TP {p.tp}) | {p.engine} | {prof} | "
                    f"{p.req_s:.2f} ({p.out_tok_s:,.0f}) | {stable:.1f} "
                    f"({_err(stable, p.req_s)}) | {cap} | {replay:.1f} "
                    f"({_err(replay, p.req_s)}) | {dist:.1f} ({_err(dist, p.req_s)}) |")
    return head + "\n".join(body) + "\n\n" + sample_note() + ".\n"


def online_rows() -> list[tuple[Online, str, dict[str, Any]]]:
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for o in ONLINE:
            trace = write_trace(Path(tmp) / f"r{o.rate:g}.csv", o.prompts, o.rate)
            for prof in ONLINE_PROFILES[o.engine]:
                d = api.simulate(o.model, o.gpu, trace=str(trace), engine=prof, tp=o.tp,
                                 **_opts(o)).data
                out.append((o, prof, d))
    return out


def online_table() -> str:
    head = ("| model | measured on | req/s | capplan profile | median TPOT ms: measured / "
            "replayed | median TTFT ms | median E2E ms | replay's mean batch |\n"
            "|---|---|---|---|---|---|---|---|\n")
    body = []
    for o, prof, d in online_rows():
        tpot, ttft, e2e = (d[k]["p50"] * 1e3 for k in ("tpot_s", "ttft_s", "e2e_s"))
        body.append(f"| {o.model} | {o.engine} | {o.rate:g} | {prof} | {o.tpot_ms:.1f} / "
                    f"{tpot:.1f} ({_err(tpot, o.tpot_ms)}) | {o.ttft_ms:.0f} / {ttft:.0f} | "
                    f"{o.e2e_ms:.0f} / {e2e:.0f} ({_err(e2e, o.e2e_ms)}) | "
                    f"{d['mean_running_batch']:.0f} |")
    return head + "\n".join(body) + "\n"


TABLES = {"validate_saturation:published": saturation_table,
          "validate_saturation:online": online_table}


def main() -> None:
    if "--write-docs" in sys.argv:
        for key, make in TABLES.items():
            write_block(DOC, key, make())
        print(f"wrote {', '.join(TABLES)} into {DOC.relative_to(ROOT)}")
        return
    print(f"ShareGPT lengths: at the means, input {SHAREGPT_INPUT_MEAN:.1f} tokens, output "
          f"per point from its own output tok/s / req/s; {NUM_PROMPTS} prompts at once\n")
    for make in TABLES.values():
        print(make())


if __name__ == "__main__":
    main()
