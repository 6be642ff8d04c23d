"""`capplan verify`: send a plan's workload to a running server and set what it measures beside
what the plan predicted for one replica (and optionally write a calibration from it)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from capplan.errors import InputError
from capplan.plan.bench_cmds import CLIENTS, dataset_name
from capplan.plan.workload_file import (
    PlannedRequest,
    check_client_sends_images,
    day_peak,
    disaggregated_layout,
    plan_rate,
    plan_requests,
    write_dataset,
)

COMPARED = (("ttft_s", "mean"), ("ttft_s", "p50"), ("ttft_s", "p99"), ("tbt_s", "mean"),
            ("tbt_s", "p50"), ("tbt_s", "p99"), ("e2e_s", "mean"), ("e2e_s", "p50"),
            ("e2e_s", "p99"), ("output_tokens_per_s", None), ("requests_per_s", None))


def load_plan_result(path_or_dict: str | Path | dict[str, Any],
                     catalog_dirs: tuple[str, ...] = ()) -> dict[str, Any]:
    """A plan result dict: given, read from `--export PLAN.json`, or computed from a plan YAML
    (without the simulator check)."""
    if isinstance(path_or_dict, dict):
        return path_or_dict
    p = Path(path_or_dict)
    if not p.is_file():
        raise InputError(f"{p}: no such plan file")
    if p.suffix.lower() == ".json":
        try:
            d = json.loads(p.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError) as e:
            raise InputError(f"{p}: not a plan JSON ({e})") from e
        if not isinstance(d, dict) or "recommendations" not in d:
            raise InputError(f"{p}: not a plan result (`capplan plan FILE --export PLAN.json`)")
        return d
    from capplan.catalog.loader import load_catalog
    from capplan.plan.planner import run_plan
    from capplan.plan.schema import load_plan

    spec = load_plan(p)
    if spec.calibration and not Path(spec.calibration).is_absolute():
        spec = spec.model_copy(update={"calibration": str(p.parent / spec.calibration)})
    cat = load_catalog(catalog_dirs)
    if spec.is_day:  # the day plan's recommendation at its peak window; the replay adds nothing
        from capplan.plan.day_run import day_options, run_day_plan

        opts = replace(day_options(spec), replay="none")
        return run_day_plan(cat, spec, None, p.parent, opts).to_dict()
    return run_plan(cat, spec, None).to_dict()


def model_plan(plan: dict[str, Any], model: str | None) -> dict[str, Any]:
    """The plan of the model verified: a plan of several models (`models`) holds one per
    model, chosen by its name in the plan file (or Hugging Face id); a plan of one model is
    itself (a `model` naming another is refused)."""
    subs = plan.get("models")
    if not subs:
        if model is not None and model not in (plan.get("model"), plan.get("hf_id")):
            raise InputError(f"--model {model}: the plan is of {plan.get('model')}")
        return plan
    names = ", ".join(str(m.get("model")) for m in subs)
    if model is None:
        raise InputError(f"the plan has several models ({names}): name the one to verify "
                         "with --model NAME")
    for m in subs:
        if model in (m.get("model"), m.get("hf_id")):
            return dict(m)
    raise InputError(f"--model {model}: not one of the plan's models ({names})")


def lane_plan(plan: dict[str, Any], lane: str | None) -> dict[str, Any]:
    """The plan of one lane's own pool (a plan of a pool per lane, `pools.separate`): its
    recommendation, with that lane alone (a day plan's peak too: the lane's own peak window
    and rate from its own day plan, `lane_days`, where the plan has one), so verify sends the
    lane's requests at its pool's per-replica rate; the plan itself without `lane`."""
    if lane is None:
        return plan
    pools = ((plan.get("pools") or {}).get("separate") or {}).get("lanes") or []
    names = [str(ln.get("lane")) for ln in pools]
    if not pools:
        raise InputError(f"--lane {lane}: the plan has no pool per lane (plan it with "
                         "`pools: separate` or `both`)")
    if lane not in names:
        raise InputError(f"--lane {lane}: not one of the plan's lanes ({', '.join(names)})")
    pool = pools[names.index(lane)]
    if not pool.get("engine_flags"):
        raise InputError(f"--lane {lane}: the lane has no pool ({pool.get('error')})")
    i = [ln.get("name") for ln in plan.get("lanes") or []].index(lane)
    out = {**plan, "recommendations": [{**pool, "rank": 1}], "lanes": [plan["lanes"][i]],
           "pools": None, "lane": lane}
    own = [d for d in plan.get("lane_days") or [] if d.get("lane") == lane]
    peak = day_peak(own[0]) if own else None
    if peak:  # the lane's own day plan: its pool is sized at its own peak (plan/lane_day.py)
        out["day"] = {**plan["day"], "peak": peak}
        return out
    peak = day_peak(plan)
    if peak and len(peak.get("lanes") or []) == len(plan["lanes"]):
        out["day"] = {**plan["day"], "peak": {**peak, "lanes": [peak["lanes"][i]]}}
    return out


def pools_note(plan: dict[str, Any], lane: str | None, layout: str) -> str | None:
    """A plan that recommends a pool per lane, verified without --lane: what was verified,
    and how to verify each pool (None otherwise)."""
    from capplan.export.layout import SEPARATE, recommended_layout

    if lane is not None or layout != "aggregated" or recommended_layout(plan) != SEPARATE:
        return None
    names = [str(ln.get("lane")) for ln in plan["pools"]["separate"]["lanes"]]
    return (f"the plan recommends a pool per lane ({', '.join(names)}); this verified one "
            f"shared pool with every lane's requests: --lane NAME verifies each lane's pool")


def lane_checks(plan: dict[str, Any], measured: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Each lane's p99s against its own SLOs, from a run of several lanes' mixed requests
    (measured `lanes`, probe.replay), or of one lane's (a plan of one lane, or `--lane`: the
    whole run): what a client's --goodput cannot check (a TBT p99, or SLOs the lanes do not
    share)."""
    lanes = plan.get("lanes") or []
    per = (measured or {}).get("lanes") or (
        {lanes[0].get("name"): measured} if measured and len(lanes) == 1 else {})
    out = []
    for ln in lanes:
        got = per.get(ln.get("name"))
        for key, metric in (("ttft_p99_s", "ttft_s"), ("tbt_p99_s", "tbt_s"),
                            ("tpot_p99_s", "tpot_s"), ("e2e_p99_s", "e2e_s")):
            limit = ln.get(key)
            if not limit or got is None:
                continue
            m = (got.get(metric) or {}).get("p99")
            out.append({"lane": ln.get("name"), "slo": key, "limit_s": limit, "measured_s": m,
                        "met": None if m is None else bool(m <= limit)})
    return out


def over_run(count: float, send_span_s: float, drain_s: float) -> float | None:
    """Throughput over a run: `count` over the first send to the last completion, which is
    the send span plus the drain after the last send (None: no send span to measure over)."""
    return count / (send_span_s + drain_s) if send_span_s > 0 else None


def run_throughput(key: str, pred: dict[str, Any], measured: dict[str, Any] | None
                   ) -> tuple[float | None, float | None]:
    """(predicted, measured) `requests_per_s` or `output_tokens_per_s` of the run verify sent
    (over_run on both sides): measured, the completed requests (their output tokens) over the
    first send to the last completion, as vllm bench serve reports them; predicted, all that
    was sent (their planned output tokens) over the same send span plus the plan's mean E2E
    (the last request's drain). A server that keeps up reads ~1; one that queues reads low.
    One request, or all at once, has no send span: both are None."""
    m = measured or {}
    span, e2e = m.get("send_span_s") or 0.0, (pred.get("e2e_s") or {}).get("mean")
    if key == "requests_per_s":
        got, planned = m.get("completed", 0), m.get("sent", 0)
    else:
        got, planned = m.get("output_tokens", 0), m.get("sent_output_tokens", 0)
    run = m.get("run_span_s") or 0.0
    measured_v = over_run(got, span, max(run - span, 0.0))
    return (over_run(planned, span, e2e) if e2e else None), measured_v


@dataclass(frozen=True)
class VerifyResult:
    """Predicted vs measured for one replica of the plan's best recommendation."""

    plan: dict[str, Any] = field(repr=False)
    requests: list[PlannedRequest] = field(repr=False)
    measured: dict[str, Any] | None = None
    dataset: str | None = None
    calibration: str | None = None
    layout: str = "aggregated"
    """aggregated (one replica of the best recommendation) or disaggregated (the P/D layout
    behind its front end, the whole workload; it predicts TTFT and TBT p99)."""
    notes: tuple[str, ...] = ()
    """What the reader should know about what was verified (pools_note)."""

    def predicted(self) -> dict[str, Any]:
        """The plan's predictions for what was run: the best recommendation's replica, or the
        disaggregated layout's (a fixed one's every figure, a sized one's TTFT and TBT p99)."""
        if self.layout != "disaggregated":
            return self.plan["recommendations"][0].get("predicted") or {}
        d = disaggregated_layout(self.plan) or {}
        if "pools" in d:
            return d
        return {"ttft_s": {"p99": d.get("ttft_p99_s")}, "tbt_s": {"p99": d.get("tbt_p99_s")}}

    def rows(self) -> list[dict[str, Any]]:
        pred = self.predicted()
        out = []
        for key, stat in COMPARED:
            p = pred.get(key)
            m = (self.measured or {}).get(key)
            if stat is None:  # throughput over this run, measured and predicted alike
                p, m = run_throughput(key, pred, self.measured)
            else:
                p, m = (p or {}).get(stat), (m or {}).get(stat)
            ratio = m / p if isinstance(m, (int, float)) and p else None
            out.append({"metric": key if stat is None else f"{key[:-2]} {stat}",
                        "unit": "/s" if key.endswith("_per_s") else "s",
                        "predicted": p, "measured": m, "measured_over_predicted": ratio})
        return out

    def to_dict(self) -> dict[str, Any]:
        best = self.plan["recommendations"][0]
        rate = (plan_rate(self.plan) if self.layout == "disaggregated"
                else best.get("per_replica_rate_per_s"))
        peak = day_peak(self.plan)
        return {"model": self.plan.get("hf_id") or self.plan.get("model"),
                "layout": self.layout, "gpu": best.get("gpu"), "tp": best.get("tp"),
                "per_replica_rate_per_s": rate,
                # a day plan is verified at its peak window, what its recommendation is for
                "day_window": None if peak is None else {
                    k: peak[k] for k in ("start_s", "end_s", "rate_per_s")},
                "requests": len(self.requests), "dataset": self.dataset,
                "lane": self.plan.get("lane"),
                "comparison": self.rows(), "measured": self.measured,
                "lane_slos": lane_checks(self.plan, self.measured),
                "calibration": self.calibration}


@dataclass(frozen=True, kw_only=True)
class VerifyOptions:
    endpoint: str | None = None
    served_model: str | None = None
    """The model name the server serves (default: the plan's Hugging Face id)."""
    client: str = "capplan"
    write_dataset: str | None = None
    requests: int | None = None
    seed: int = 0
    trace: str | None = None
    timeout_s: float = 60.0
    calibration_out: str | None = None
    catalog_dirs: tuple[str, ...] = ()
    layout: str = "aggregated"
    """aggregated: one replica of the best recommendation; disaggregated: the plan's P/D
    layout behind its front end (the whole workload)."""
    model: str | None = None
    """A plan of several models: the one to verify (its name in the plan file)."""
    lane: str | None = None
    """A plan of a pool per lane: the lane whose own pool is verified (lane_plan)."""


def verify_plan(plan: str | Path | dict[str, Any], opts: VerifyOptions) -> VerifyResult:
    """Write the workload dataset and/or run it against `opts.endpoint`."""
    if opts.client not in (*CLIENTS, "capplan"):
        raise InputError(f"--client {opts.client}: expected one of capplan, {', '.join(CLIENTS)}")
    if opts.endpoint is None and opts.write_dataset is None:
        raise InputError("give --endpoint URL (run the workload) or --write-dataset FILE")
    if opts.write_dataset is not None and not str(opts.write_dataset).strip():
        # an empty path is no file: writing a default name in the CWD would be a guess
        raise InputError("--write-dataset '': expected a file path, e.g. "
                         f"--write-dataset {dataset_name(opts.client)}")
    if opts.endpoint is not None and opts.calibration_out:
        from capplan.export.atomic import check_writable

        check_writable(Path(opts.calibration_out))  # before the run, not after its minutes
    if opts.layout not in ("aggregated", "disaggregated"):
        raise InputError(f"--layout {opts.layout}: expected aggregated or disaggregated")
    if opts.layout == "disaggregated" and opts.calibration_out:
        raise InputError("--out fits one aggregated replica's host costs: verify --layout "
                         "aggregated against one replica to write a calibration")
    d = lane_plan(model_plan(load_plan_result(plan, opts.catalog_dirs), opts.model), opts.lane)
    if opts.lane is not None and opts.layout != "aggregated":
        raise InputError(f"--lane {opts.lane}: a lane's own pool is aggregated; leave out "
                         "--layout")
    if opts.write_dataset is not None:
        check_client_sends_images(d, opts.client)
    reqs = plan_requests(d, num_requests=opts.requests, seed=opts.seed, trace=opts.trace,
                         layout=opts.layout)
    ds = None
    if opts.write_dataset is not None:
        ds = str(write_dataset(opts.write_dataset, opts.client, reqs))
    measured = cal = None
    if opts.endpoint is not None:
        from capplan.probe.replay import replay

        model = opts.served_model or d.get("hf_id") or d["model"]
        measured = replay(opts.endpoint, model, reqs, opts.timeout_s)
        if not measured.get("completed"):
            raise InputError(f"{opts.endpoint}: every request failed ({_kinds(measured)}); "
                             "is it an OpenAI-compatible server serving that model?")
        if opts.calibration_out:
            cal = _write_calibration(d, measured, opts)
    note = pools_note(d, opts.lane, opts.layout)
    return VerifyResult(d, reqs, measured, ds, cal, opts.layout, (note,) if note else ())


def _kinds(level: dict[str, Any]) -> str:
    kinds = level.get("error_kinds") or {}
    return ", ".join(f"{k} x{v}" for k, v in kinds.items()) or "no response"


def _write_calibration(d: dict[str, Any], level: dict[str, Any], opts: VerifyOptions) -> str:
    """The host overheads fitted from the measured level (capplan.probe.results.fit_levels)."""
    from capplan.catalog.loader import load_catalog
    from capplan.probe.results import fit_levels, write_levels_calibration

    best = d["recommendations"][0]
    fit = fit_levels([level], d["model"], best["gpu"], load_catalog(opts.catalog_dirs),
                     _engine_options(best))
    write_levels_calibration(Path(opts.calibration_out or ""), [level], fit)
    return str(opts.calibration_out)


def _engine_options(rec: dict[str, Any]) -> Any:
    """The recommendation's replica as EngineOptions (what the fit predicts the level on):
    its engine profile, TP and limits; what the plan does not say keeps the engine default."""
    from capplan.plan.deployment import EngineOptions

    keys = ("tp", "pp", "attention_dp", "expert_parallel", "max_num_seqs",
            "max_num_batched_tokens", "max_model_len", "gpu_memory_utilization",
            "weight_dtype", "kv_dtype")
    given = {k: rec[k] for k in keys if rec.get(k) is not None}
    return EngineOptions(engine=rec.get("engine_profile") or rec.get("engine") or "vllm",
                         **given)
