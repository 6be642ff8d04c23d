"""Fuzz the inputs issue 30 added or hardened: traces with hash_ids, results files (aggregate
and AIPerf per-request records), calibration and catalog numbers, the Python API's keywords.

The CLI properties are those of test_fuzz_cli.check (exit 0 with finite numbers, or exit 2 with
one `Error:` line; never a traceback, never exit 1). The API property: a result, or InputError;
never another exception. `make test` runs a few derandomised examples each; `make fuzz` runs
CAPPLAN_FUZZ_EXAMPLES per property.
"""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path
from typing import Any

import yaml
from hypothesis import given
from hypothesis import strategies as st
from test_fuzz_cli import _settings, _time_limit, check  # tests/fuzz is on sys.path

REPO = Path(__file__).resolve().parents[2]
NUM = st.one_of(st.integers(0, 5000), st.floats(min_value=0, max_value=1e4),
                st.sampled_from([-1, 0, 1e308, -1e308, 2**63, 10**30, 1e-300, True, None, "5",
                                 "x", [], {}]),
                st.floats(allow_nan=True, allow_infinity=True))
HASH_IDS = st.one_of(st.lists(st.integers(-2**70, 2**70), max_size=40),
                     st.lists(st.integers(0, 50), max_size=300),
                     st.sampled_from([None, "", "[1,2", [[1, 2]], ["a"], 5, {"a": 1}]))


@_settings(5)
@given(rows=st.lists(st.fixed_dictionaries({
    "timestamp": NUM, "input_length": NUM, "output_length": NUM, "hash_ids": HASH_IDS}),
    min_size=1, max_size=6), unit=st.sampled_from(["auto", "ms", "s"]))
def test_fuzz_trace_with_hash_ids(rows: list[dict[str, Any]], unit: str) -> None:
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "trace.jsonl"
        p.write_text("".join(json.dumps(r, allow_nan=True) + "\n" for r in rows))
        check(["simulate", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--trace", str(p),
               "--time-unit", unit, "--format", "json"])


_METRIC = st.fixed_dictionaries({"value": st.one_of(NUM, st.lists(NUM, max_size=4)),
                                 "unit": st.sampled_from(["ms", "ns", "s", "tokens", "x"])})
RECORD = st.fixed_dictionaries(
    {"metadata": st.fixed_dictionaries({}, optional={
        "credit_phase": st.sampled_from(["profiling", "warmup", None])}),
     "metrics": st.dictionaries(st.sampled_from(
         ["ttft", "request_latency", "inter_chunk_latency", "inter_token_latency",
          "output_sequence_length", "input_sequence_length", "min_request_timestamp",
          "max_response_timestamp"]), _METRIC, max_size=8),
     "error": st.one_of(st.none(), st.just({"type": "E", "message": "m"}), NUM)})
VLLM = st.fixed_dictionaries({"max_concurrency": NUM, "completed": NUM, "duration": NUM},
                             optional={"mean_ttft_ms": NUM, "median_ttft_ms": NUM,
                                       "p99_itl_ms": NUM, "mean_itl_ms": NUM,
                                       "model_id": st.sampled_from(["a", "b", 5]),
                                       "ttfts": st.lists(NUM, max_size=3),
                                       "itls": st.lists(st.lists(NUM, max_size=3), max_size=3)})


@_settings(8)
@given(docs=st.one_of(st.lists(RECORD, min_size=1, max_size=5), st.lists(VLLM, min_size=1,
                                                                          max_size=2)))
def test_fuzz_results_files(docs: list[dict[str, Any]]) -> None:
    with tempfile.TemporaryDirectory() as d:
        files = []
        for i, doc in enumerate(docs if "metadata" not in docs[0] else [None]):
            p = Path(d) / f"r{i}.json{'l' if doc is None else ''}"
            p.write_text("".join(json.dumps(x, allow_nan=True) + "\n" for x in docs)
                         if doc is None else json.dumps(doc, allow_nan=True))
            files.append(str(p))
        check(["calibrate", "--from-results", *files, "--format", "json"])


PARAMS = ("step_overhead_s", "per_seq_overhead_s", "per_layer_overhead_s", "request_overhead_s",
          "mem_bw_frac", "gemm_frac", "gemm_half_tokens", "allreduce_latency_s")


@_settings(5)
@given(params=st.dictionaries(st.sampled_from(PARAMS), NUM, max_size=3))
def test_fuzz_calibration_numbers(params: dict[str, Any]) -> None:
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "cal.yaml"
        p.write_text(yaml.safe_dump({"gpu": "h100-sxm", "kind": "measured", "params": params}))
        check(["latency", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--rate", "2",
               "--calibration", str(p), "--format", "json"])


GPU_FIELDS = ("memory_mib", "cuda_total_memory_gib", "memory_bandwidth_gb_per_s",
              "bf16_dense_tflops", "fp8_dense_tflops", "price_per_hour_usd")


@_settings(4)
@given(changes=st.dictionaries(st.sampled_from(GPU_FIELDS), NUM, min_size=1, max_size=2))
def test_fuzz_catalog_gpu_numbers(changes: dict[str, Any]) -> None:
    spec = yaml.safe_load((REPO / "gpu_catalog" / "h100-sxm.yaml").read_text())
    spec.update(key="h100-fuzz", name="H100 fuzz", aliases=[], nvml_names=[], **changes)
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "gpus").mkdir()
        (Path(d) / "gpus" / "h100-fuzz.yaml").write_text(yaml.safe_dump(spec))
        check(["memory", "--model", "llama-3.1-8b", "--gpu", "h100-fuzz", "--catalog-dir", d,
               "--format", "json"])


API_KW = {"rate": NUM, "concurrency": NUM, "burstiness": NUM, "num_prompts": NUM,
          "max_num_seqs": NUM, "max_num_batched_tokens": NUM, "max_model_len": NUM,
          "gpu_memory_utilization": NUM, "tp": NUM, "block_size": NUM}


def _finite(obj: Any) -> None:
    if isinstance(obj, dict):
        for v in obj.values():
            _finite(v)
    elif isinstance(obj, list):
        for v in obj:
            _finite(v)
    elif isinstance(obj, float):
        assert math.isfinite(obj)


@_settings(10)
@given(fn=st.sampled_from(["latency", "speed", "memory"]),
       kw=st.dictionaries(st.sampled_from(sorted(API_KW)), NUM, max_size=3),
       batch=st.one_of(st.none(), st.lists(NUM, max_size=3)))
def test_fuzz_python_api_keywords(fn: str, kw: dict[str, Any], batch: Any) -> None:
    import capplan
    from capplan.errors import InputError

    if fn != "latency":
        kw = {k: v for k, v in kw.items() if k not in ("rate", "concurrency", "burstiness",
                                                        "num_prompts")}
    elif "rate" not in kw and "concurrency" not in kw:
        kw["rate"] = 2
    if fn == "speed" and batch is not None:
        kw["batch"] = batch
    try:
        with _time_limit(30):
            res = getattr(capplan, fn)("llama-3.1-8b", "h100-sxm", **kw)
    except InputError:
        return
    out = res.to_dict()
    if fn != "latency" or out.get("stable", True):
        _finite({k: v for k, v in out.items() if k not in ("capacity_requests_per_s",)})
