"""The screen's latency laws against the replay under SGLang's prefill-first steps (vLLM's mixed
chunked steps as the control).

For DeepSeek-V3 TP 8 and Llama-3.1-70B TP 4 on H200, prompts of 1,000, 2,000 and 8,000 tokens
and lognormal ones (mean 1,000, p99 4,000: the law read on its lattice), 500-token outputs, at
30%, 60% and 85% of the analytic capacity, the analytic queue
(`capplan.models.queueing`) and the replay of 3,000 open-loop Poisson requests (compiled engine,
seeds 0 and 1) give TBT and TTFT, mean and p99. The table gives the analytic figure, the two
replays' and the difference from their mean; the prefill-first TBT law is in docs/queueing.md
(item 2, "Prefill-first engines").

Run: `.venv/bin/python benchmarks/validate_prefill_first.py [--write-docs]` (three to six
minutes; `--write-docs` rewrites the block `validate_prefill_first:grid` in docs/queueing.md).
"""

from __future__ import annotations

import sys

import numpy as np

from capplan.api import deployment
from capplan.plan.load import analytic_latency, load_spec_from_options, queue_model
from capplan.plan.simulation import run_simulation

DEPLOYMENTS = (("deepseek-v3", 8), ("llama-3.1-70b", 4))
ENGINES = ("sglang", "vllm")
PROMPTS = ("1000", "2000", "8000", "lognormal:mean=1000,p99=4000")
LOADS = (0.3, 0.6, 0.85)
OUTPUT = "500"
REQUESTS = 3000
SEEDS = (0, 1)
DOC = "docs/queueing.md"


def _cell(dep, inp: str, load: float) -> dict[str, float | tuple[float, ...]]:
    ml = dep.model.context_len(dep.settings.max_model_len)
    cap = float(queue_model(dep, load_spec_from_options(1.0, None, None, inp, OUTPUT, 1.0,
                                                        ml)).capacity_rate())
    rate = load * cap
    ana = analytic_latency(dep, load_spec_from_options(rate, None, None, inp, OUTPUT, 1.0,
                                                       ml))
    sims = [run_simulation(dep, rate=rate, concurrency=None, trace=None, input_len=inp,
                           output_len=OUTPUT, burstiness=1.0, requests=REQUESTS, seed=seed,
                           schedulers=("continuous",), sim_engine="compiled")
            ["results"]["continuous"] for seed in SEEDS]
    out: dict[str, float | tuple[float, ...]] = {"rate": rate}
    for key, q in (("tbt_s", "p99"), ("tbt_s", "mean"), ("ttft_s", "p99"), ("ttft_s", "mean")):
        out[f"{key}.{q}"] = float(ana[key][q])
        out[f"{key}.{q}.replay"] = tuple(float(s[key][q]) for s in sims)
    return out


def _diff(c: dict, name: str) -> str:
    a, r = c[name], float(np.mean(c[f"{name}.replay"]))
    return f"{a / r - 1:+.0%}"


def rows() -> list[str]:
    out = ["| engine | model | prompt | load | rate (req/s) | TBT p99 screen (ms) | "
           "TBT p99 replays (ms) | TBT p99 | TBT mean | TTFT p99 | TTFT mean |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for eng in ENGINES:
        for model, tp in DEPLOYMENTS:
            dep = deployment(model, "h200", tp=tp, engine=eng)
            for inp in PROMPTS:
                for load in LOADS:
                    c = _cell(dep, inp, load)
                    replays = " / ".join(f"{v * 1e3:.1f}" for v in c["tbt_s.p99.replay"])
                    out.append(
                        f"| {eng} | {model} TP {tp} | {inp} | {load:.0%} | {c['rate']:.2f} | "
                        f"{c['tbt_s.p99'] * 1e3:.1f} | {replays} | {_diff(c, 'tbt_s.p99')} | "
                        f"{_diff(c, 'tbt_s.mean')} | {_diff(c, 'ttft_s.p99')} | "
                        f"{_diff(c, 'ttft_s.mean')} |")
                    print(out[-1], file=sys.stderr, flush=True)
    return out


def main() -> None:
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from docblocks import ROOT, report

    report(ROOT / DOC, "validate_prefill_first", {"grid": rows()}, "", "--write-docs" in sys.argv)


if __name__ == "__main__":
    main()
