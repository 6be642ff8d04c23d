"""vllm@0.6 and sglang@0.3 against the published runs of vLLM 0.6.0 and SGLang 0.3.0 they were
built for (sgl-project/sglang benchmark/benchmark_vllm_060/README.md; docs/validation.md 4c).

The replays use benchmarks/validate_saturation.py's protocol: ShareGPT lengths as
bench_serving samples them (benchmarks/data/sharegpt_llama31_lengths.csv), Poisson arrivals for
the online runs, 5,000 requests at once for the offline plateau. Tolerance 10% (issue 24's bar
for saturation rates). Not asserted: SGLang 0.3.0's 70B plateau, which `sglang@0.3` replays 16%
over (docs/validation.md 4c says what is and is not known of that miss).
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

from capplan import api

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
sat = importlib.import_module("validate_saturation")

RELEASE_PROFILE = {"vLLM 0.6.0": "vllm@0.6", "SGLang 0.3.0": "sglang@0.3"}


@pytest.mark.parametrize("run", sat.ONLINE, ids=lambda o: f"{o.model}-{o.engine}-{o.rate:g}")
def test_online_median_tpot_within_10_percent(run, tmp_path):
    trace = sat.write_trace(tmp_path / "t.csv", run.prompts, run.rate)
    d = api.simulate(run.model, run.gpu, trace=str(trace), engine=RELEASE_PROFILE[run.engine],
                     tp=run.tp, **sat._opts(run)).data
    assert d["tpot_s"]["p50"] * 1e3 == pytest.approx(run.tpot_ms, rel=0.10)


@pytest.mark.parametrize("point", [p for p in sat.POINTS if p.engine == "vLLM 0.6.0"],
                         ids=lambda p: p.model)
def test_vllm_060_plateau_within_10_percent(point, tmp_path):
    trace = sat.write_trace(tmp_path / "t.csv", sat.NUM_PROMPTS, None)
    assert sat.replayed_rate(point, "vllm@0.6", trace) == pytest.approx(point.req_s, rel=0.10)
