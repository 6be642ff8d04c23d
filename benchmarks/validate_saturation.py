"""Open-loop saturation against published throughput plateaus (docs/validation.md, section 4c).

Run: .venv/bin/python benchmarks/validate_saturation.py [--write-docs]

Each point is a published run that sent a whole ShareGPT sample at once (`--request-rate inf`)
and reports the request throughput it sustained: the plateau an open loop saturates at. For each
one capplan is asked as a user would ask it:
- `capplan latency --rate R`: the highest R it answers as stable (bisected on its verdict), and
  the capacity its UNSTABLE message prints;
- `capplan simulate`: the benchmark itself replayed (all requests arriving at once, as
  `--request-rate inf` sends them; requests / makespan).
Nothing here is fitted to these figures; every point is printed, the bad ones too.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any

from docblocks import ROOT, write_block  # benchmarks/ is on sys.path when run as a script

from capplan import api

DOC = ROOT / "docs" / "validation.md"

SGLANG_060 = ("https://github.com/sgl-project/sglang/blob/main/benchmark/benchmark_vllm_060/"
              "README.md")
"""SGLang v0.3.0 against vLLM v0.6.0, "Offline benchmark results": `python3 -m
sglang.bench_serving --backend {sglang,vllm} --dataset-name sharegpt --num-prompts 5000`
(request rate inf). vLLM served with `--num-scheduler-steps 10 --max_model_len 4096`; SGLang
with `--disable-radix-cache` (8B also `--enable-torch-compile`, 70B `--mem-frac 0.88`)."""

SHAREGPT_INPUT_MEAN = 453502 / 2000
"""Mean prompt tokens of bench_serving's ShareGPT sample: 453,502 input tokens over 2,000
prompts (same sampler and seed, Llama-3.1 tokenizer), github.com/sgl-project/sglang/issues/1639
(comment of 2024-10-17). The 5,000-prompt runs do not print their input total."""

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
    profile: str
    """capplan's profile for it: the oldest it models (older releases are refused)."""
    req_s: float
    out_tok_s: float
    source: str
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def output_mean(self) -> float:
        """Mean output tokens: the source's output tok/s over its req/s (same run)."""
        return self.out_tok_s / self.req_s


POINTS = (
    Point("llama-3.1-8b", "a100-sxm", 1, "vLLM 0.6.0", "vllm@0.11", 21.27, 4132.37, SGLANG_060,
          {"max_model_len": 4096}),
    Point("llama-3.1-8b", "a100-sxm", 1, "vLLM 0.6.0", "vllm@0.14", 21.27, 4132.37, SGLANG_060,
          {"max_model_len": 4096}),
    Point("llama-3.1-8b", "a100-sxm", 1, "SGLang 0.3.0", "sglang@0.4", 22.03, 4281.51,
          SGLANG_060),
    Point("llama-3.1-70b", "h100-sxm", 4, "vLLM 0.6.0", "vllm@0.11", 19.04, 3700.64, SGLANG_060,
          {"max_model_len": 4096}),
    Point("llama-3.1-70b", "h100-sxm", 4, "vLLM 0.6.0", "vllm@0.14", 19.04, 3700.64, SGLANG_060,
          {"max_model_len": 4096}),
    Point("llama-3.1-70b", "h100-sxm", 4, "SGLang 0.3.0", "sglang@0.4", 19.84, 3856.01,
          SGLANG_060, {"gpu_memory_utilization": 0.88}),
)


def _latency(p: Point, rate: float) -> dict[str, Any]:
    return api.latency(p.model, p.gpu, rate=rate, input_len=round(SHAREGPT_INPUT_MEAN),
                       output_len=round(p.output_mean), engine=p.profile, tp=p.tp,
                       **p.options).data


def highest_stable_rate(p: Point, rel: float = 0.005) -> tuple[float, float | None]:
    """The highest rate `capplan latency --rate` answers as stable (bisection to `rel`), and
    the capacity its first UNSTABLE answer prints."""
    lo, hi, printed = 0.0, 1.0, None
    while (d := _latency(p, hi))["stable"]:
        lo, hi = hi, hi * 2
    printed = d.get("capacity_requests_per_s")
    while hi - lo > rel * hi:
        mid = (lo + hi) / 2
        if _latency(p, mid)["stable"]:
            lo = mid
        else:
            hi = mid
    return lo, printed


def replayed_rate(p: Point) -> float:
    """The benchmark replayed: NUM_PROMPTS requests at once; completed requests / makespan."""
    d = api.simulate(p.model, p.gpu, rate=INF_RATE, requests=NUM_PROMPTS,
                     input_len=round(SHAREGPT_INPUT_MEAN), output_len=round(p.output_mean),
                     engine=p.profile, tp=p.tp, **p.options).data
    return float(d["requests_per_s"])


def _err(pred: float, meas: float) -> str:
    return f"{pred / meas - 1:+.0%}"


def rows() -> list[tuple[Point, float, float | None, float]]:
    return [(p, *highest_stable_rate(p), replayed_rate(p)) for p in POINTS]


def saturation_table() -> str:
    head = ("| model | GPUs | measured on | capplan profile | measured req/s (output tok/s) | "
            "`latency --rate`: highest stable req/s | its printed capacity | "
            "`simulate` replay req/s |\n|---|---|---|---|---|---|---|---|\n")
    body = []
    for p, stable, printed, replay in rows():
        cap = f"{printed:.1f} ({_err(printed, p.req_s)})" if printed else "-"
        body.append(f"| {p.model} | {p.tp}x {p.gpu} (TP {p.tp}) | {p.engine} | {p.profile} | "
                    f"{p.req_s:.2f} ({p.out_tok_s:,.0f}) | {stable:.1f} "
                    f"({_err(stable, p.req_s)}) | {cap} | {replay:.1f} "
                    f"({_err(replay, p.req_s)}) |")
    return head + "\n".join(body) + "\n"


TABLES = {"validate_saturation:published": saturation_table}


def main() -> None:
    if "--write-docs" in sys.argv:
        for key, make in TABLES.items():
            write_block(DOC, key, make())
        print(f"wrote {', '.join(TABLES)} into {DOC.relative_to(ROOT)}")
        return
    print(f"ShareGPT lengths: input {SHAREGPT_INPUT_MEAN:.1f} tokens (mean), output per point "
          f"from its own output tok/s / req/s; {NUM_PROMPTS} prompts at once\n")
    print(saturation_table())


if __name__ == "__main__":
    main()
