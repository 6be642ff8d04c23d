"""`capplan schema` and the planner agree on what a plan file is: a table of the plan-file
audit's cases, each through the JSON Schema and through `load_plan` (plus the plan-level
checks the schema also states: export paths, the engine's name). jsonschema is not installed
in this environment, so `_valid` below evaluates the keywords the schema uses (type, enum,
const, pattern, minimum/maximum, minItems, properties, additionalProperties, required,
anyOf/oneOf/allOf, items, $ref)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from capplan.errors import InputError
from capplan.plan.schema import load_plan, plan_json_schema

SCHEMA = plan_json_schema()
_TYPES = {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None)}


def _type_ok(v: Any, t: str) -> bool:
    if t == "integer":
        return isinstance(v, int | float) and not isinstance(v, bool) and float(v).is_integer()
    if t == "number":
        return isinstance(v, int | float) and not isinstance(v, bool)
    return isinstance(v, _TYPES[t])


def _valid(v: Any, s: dict[str, Any]) -> bool:
    if "$ref" in s:
        return _valid(v, SCHEMA["$defs"][s["$ref"].rsplit("/", 1)[1]])
    return all(ok(v, s) for ok in (_combined, _scalar, _array, _object))


def _combined(v: Any, s: dict[str, Any]) -> bool:
    return (all(_valid(v, x) for x in s.get("allOf", []))
            and ("anyOf" not in s or any(_valid(v, x) for x in s["anyOf"]))
            and ("oneOf" not in s or sum(_valid(v, x) for x in s["oneOf"]) == 1))


def _scalar(v: Any, s: dict[str, Any]) -> bool:
    if "type" in s and not _type_ok(v, s["type"]):
        return False
    if "enum" in s and v not in s["enum"] or "const" in s and v != s["const"]:
        return False
    if isinstance(v, str) and "pattern" in s and not re.search(s["pattern"], v):
        return False
    if not _type_ok(v, "number"):
        return True
    return not (v < s.get("minimum", v) or v > s.get("maximum", v)
                or ("exclusiveMinimum" in s and v <= s["exclusiveMinimum"]))


def _array(v: Any, s: dict[str, Any]) -> bool:
    return not isinstance(v, list) or (len(v) >= s.get("minItems", 0) and all(
        _valid(x, s["items"]) for x in v if "items" in s))


def _object(v: Any, s: dict[str, Any]) -> bool:
    if not isinstance(v, dict):
        return True
    if any(k not in v for k in s.get("required", [])):
        return False
    props, extra = s.get("properties", {}), s.get("additionalProperties", True)
    for k, x in v.items():
        sub = props.get(k, extra if isinstance(extra, dict) else None)
        if sub is None and extra is False or isinstance(sub, dict) and not _valid(x, sub):
            return False
    return True


BASE: dict[str, Any] = {
    "version": 1, "model": "llama-3.1-8b", "candidates": {"gpus": ["h100-sxm"], "tp": [1]},
    "workloads": [{"name": "chat", "rate_per_s": 4, "input_len": 500, "output_len": 100,
                   "slo": {"ttft_p99_s": 1.0, "tbt_p99_s": "60ms"}}]}


def _with(path: str, value: Any) -> dict[str, Any]:
    doc = yaml.safe_load(yaml.safe_dump(BASE))
    *head, last = path.split(".")
    node: Any = doc
    for p in head:
        node = node[int(p)] if isinstance(node, list) else node.setdefault(p, {})
    node[int(last) if isinstance(node, list) else last] = value
    return doc


CASES = [  # (what, the file, valid to both)
    ("base", BASE, True),
    ("headroom AUTO", _with("headroom", "AUTO"), True),
    ("headroom auto", _with("headroom", "auto"), True),
    ("headroom text", _with("headroom", "lots"), False),
    ("allow_near_floor 'yes'", _with("allow_near_floor", "yes"), False),
    ("allow_near_floor 1", _with("allow_near_floor", 1), False),
    ("tbt 60MS", _with("workloads.0.slo.tbt_p99_s", "60MS"), True),
    ("tbt 1.5S", _with("workloads.0.slo.tbt_p99_s", "1.5S"), True),
    ("ttft 0ms", _with("workloads.0.slo.ttft_p99_s", "0ms"), False),
    ("e2e 100000 s", _with("workloads.0.slo.e2e_p99_s", 100000), False),
    ("input_len 500.0", _with("workloads.0.input_len", 500.0), True),
    ("max_model_len 4096.0", _with("engine.max_model_len", 4096.0), True),
    ("input_len 0", _with("workloads.0.input_len", 0), False),
    ("input_len -5", _with("workloads.0.input_len", -5), False),
    ("workloads []", _with("workloads", []), False),
    ("gpus []", _with("candidates.gpus", []), False),
    ("tp []", _with("candidates.tp", []), False),
    ("max_num_seqs []", _with("engine.max_num_seqs", []), False),
    ("weight_dtypes []", _with("candidates.weight_dtypes", []), False),
    ("engine tgi", _with("engine.name", "tgi"), False),
    ("engine SGLang", _with("engine.name", "SGLang"), True),
    ("engine vllm@0.11", _with("engine.name", "vllm@0.11"), True),
    ("engine TensorRT-LLM", _with("engine.name", "TensorRT-LLM"), True),
    ("engine tensorrt", _with("engine.name", "tensorrt"), False),
    ("export x.pdf", _with("export", ["x.pdf"]), False),
    ("export /tmp/x.json", _with("export", ["/tmp/x.json"]), False),
    ("export ../x.json", _with("export", ["../x.json"]), False),
    ("export out/PLAN.JSON", _with("export", ["PLAN.JSON"]), True),
    ("lane name ''", _with("workloads.0.name", ""), False),
    ("lane name ' '", _with("workloads.0.name", " "), False),
    # a duration string past a day (86,400 s)
    ("e2e 100h", _with("workloads.0.slo.e2e_p99_s", "100h"), False),
    ("e2e 24h", _with("workloads.0.slo.e2e_p99_s", "24h"), True),
    ("e2e 24.5H", _with("workloads.0.slo.e2e_p99_s", "24.5H"), False),
    ("e2e 1440min", _with("workloads.0.slo.e2e_p99_s", "1440min"), True),
    ("e2e 1441m", _with("workloads.0.slo.e2e_p99_s", "1441m"), False),
    ("e2e '86400'", _with("workloads.0.slo.e2e_p99_s", "86400"), True),
    ("e2e 86400.5s", _with("workloads.0.slo.e2e_p99_s", "86400.5s"), False),
    ("e2e 86400001ms", _with("workloads.0.slo.e2e_p99_s", "86400001ms"), False),
    ("tbt 5e-2s", _with("workloads.0.slo.tbt_p99_s", "5e-2s"), True),
    ("e2e 1e3s", _with("workloads.0.slo.e2e_p99_s", "1e3s"), False),
    ("tbt 5000us", _with("workloads.0.slo.tbt_p99_s", "5000us"), True),
    ("tbt 5000µs", _with("workloads.0.slo.tbt_p99_s", "5000µs"), True),
    ("tbt 5000ΜS (Greek capital mu)", _with("workloads.0.slo.tbt_p99_s", "5000ΜS"), False),
    # whole floats in count fields (an integer to JSON Schema)
    ("verify.top 2.0", _with("verify.top", 2.0), True),
    ("verify.top 2.5", _with("verify.top", 2.5), False),
    ("verify.requests 500.0", _with("verify.requests", 500.0), True),
    ("engine.spec_topk 1.0", _with("engine.spec_topk", 1.0), True),
    ("adapters 0.0", _with("workloads.0.adapters", 0.0), True),
    ("adapters true", _with("workloads.0.adapters", True), False),
    ("images_per_request 0.0", _with("workloads.0.images_per_request", 0.0), True),
    ("image_width 512.0", _with("workloads.0.image_width", 512.0), True),
    ("image_height 512.0", _with("workloads.0.image_height", 512.0), True),
    ("export .json", _with("export", [".json"]), False),
    ("export out/.md", _with("export", ["out/.md"]), False),
    ("export x.k8s.yaml", _with("export", ["x.k8s.yaml"]), True),
    ("engine 'vllm +overlap'", _with("engine.name", "vllm +overlap"), True),
    ("engine 'sglang++overlap'", _with("engine.name", "sglang++overlap"), False),
    ("engine 'vllm@'", _with("engine.name", "vllm@"), False),
]


def _planner_ok(doc: dict[str, Any], tmp_path: Path) -> bool:
    """load_plan, then the plan-level checks `capplan plan` makes before planning: each
    export's path (plan.load.plan_output_path) and suffix (capplan.export.check_exports)."""
    from capplan.export import check_exports
    from capplan.plan.load import plan_output_path

    p = tmp_path / "case.yaml"
    p.write_text(yaml.safe_dump(doc, allow_unicode=True))
    try:
        plan = load_plan(p)
        check_exports([plan_output_path(x, tmp_path, None) for x in plan.export])
    except InputError:
        return False
    return True


@pytest.mark.parametrize(("what", "doc", "ok"), CASES, ids=[c[0] for c in CASES])
def test_schema_and_planner_agree(what, doc, ok, tmp_path) -> None:
    assert _valid(doc, SCHEMA) is ok, f"schema on {what}"
    assert _planner_ok(doc, tmp_path) is ok, f"planner on {what}"


@pytest.mark.parametrize("at", ["00:00", "9:30", "23:59:59", "24:00", "25:00", "12:60", "x"])
def test_rate_curve_times_agree(at, tmp_path) -> None:
    doc = _with("workloads.0", {"name": "d", "input_len": 500, "output_len": 100,
                                "rate_curve": [{"at": at, "rate_per_s": 2}]})
    from capplan.plan.rate_curve import _clock

    try:
        _clock(at, "rate_curve[0]")
        ok = True
    except InputError:
        ok = False
    assert _valid(doc, SCHEMA) is ok
    assert ok is (at in ("00:00", "9:30", "23:59:59", "24:00"))


def test_day_min_replicas_whole_float_agrees(tmp_path) -> None:
    """day.min_replicas: 1.0 is the integer 1 to both (a day plan's `day:` needs a day lane)."""
    doc = _with("workloads.0", {"name": "d", "input_len": 500, "output_len": 100,
                                "rate_curve": [{"at": "00:00", "rate_per_s": 2}]})
    doc["day"] = {"min_replicas": 1.0}
    assert _valid(doc, SCHEMA)
    assert _planner_ok(doc, tmp_path)


@pytest.mark.parametrize("spec", ["vllm", "vllm +overlap", " SGLang ", "_VLLM_", "Tensor-RT-LLM",
                                  "vllm @0.11", "vllm@", "vllm@0.11@1", "sglang++overlap",
                                  "v llm", "vllm+", "tgi", "vllm@0.11 +overlap"])
def test_engine_pattern_refuses_what_the_parser_refuses(spec) -> None:
    """The schema's engine pattern is the parser's own gate: a spec the pattern refuses the
    planner refuses (the planner may refuse more: releases and options it lacks)."""
    from capplan.models.engine import ENGINE_PATTERN, engine_profile

    try:
        engine_profile(spec)
        planner = True
    except InputError:
        planner = False
    schema = re.match(ENGINE_PATTERN, spec) is not None
    assert schema or not planner, spec
    assert schema is _valid(_with("engine.name", spec), SCHEMA)


def test_the_export_pattern_takes_every_export_suffix():
    # the schema spells the suffixes out (capplan.export imports the planner: a circle), so
    # each of the exporters' own suffixes must match it, and no other
    import re

    from capplan.export import EXPORT_SUFFIXES
    from capplan.plan.schema import EXPORT_PATTERN

    assert all(re.match(EXPORT_PATTERN, "plan" + s) for s in EXPORT_SUFFIXES)
    assert not re.match(EXPORT_PATTERN, "plan.yaml")
