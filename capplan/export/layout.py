"""Which layout a plan recommends, said the same way by every export: the aggregated fleet
(recommendation 1), the disaggregated prefill/decode layout when it wins, or a pool per lane
when the plan asks for one; the Kubernetes export deploys the same (`k8s.plan_pools`). Also
the disaggregated layout's figures and launch lines as the reports print them."""

from __future__ import annotations

from typing import Any

from capplan.export.json_export import jsonable
from capplan.plan.bench_cmds import bench_url
from capplan.units import s_to_ms

AGGREGATED, DISAGGREGATED, SEPARATE = "aggregated", "disaggregated", "separate"


def recommended_layout(plan: dict[str, Any]) -> str:
    """DISAGGREGATED when the disaggregated layout wins (both pools sized), SEPARATE when the
    plan asks for a pool per lane and every lane has one, else AGGREGATED."""
    d = plan.get("disaggregated") or {}
    if (d.get("winner") == DISAGGREGATED and isinstance(d.get("prefill"), dict)
            and isinstance(d.get("decode"), dict)):
        return DISAGGREGATED
    lanes = ((plan.get("pools") or {}).get("separate") or {}).get("lanes") or []
    if (plan.get("inputs") or {}).get("pools") == SEPARATE and lanes and all(
            isinstance(ln, dict) and ln.get("engine_flags") for ln in lanes):
        return SEPARATE
    return AGGREGATED


def _gpus(n: Any) -> str:
    return f"{n} GPU{'' if n == 1 else 's'}"


def _cost(c: Any) -> str:
    c = jsonable(c)
    return f", ${c:,.2f}/h" if isinstance(c, int | float) else ""


def _ms(x: Any, fmt: str) -> str:
    x = jsonable(x)
    return format(x * 1e3, fmt) if isinstance(x, int | float) else "?"


def fleet_text(rec: dict[str, Any]) -> str:
    """"3 x h200 TP 8 (24 GPUs, $96.00/h)": a recommendation's (or a pool's) fleet."""
    from capplan.plan.launch import fleet_words

    return fleet_words(rec, _cost(rec.get("cost_per_hour")))


def headline(plan: dict[str, Any]) -> str:
    """"recommended: ..." in a sentence: the layout, its fleet, and where the aggregated
    table's rank 1 stands beside it (not the disaggregated comparison's verdict, which the
    reports give in their disaggregated section)."""
    recs = plan.get("recommendations") or []
    if not recs:
        return "recommended: none (no configuration meets the constraints)"
    best, layout, d = recs[0], recommended_layout(plan), plan.get("disaggregated") or {}
    if layout == DISAGGREGATED:
        return (f"recommended: the disaggregated prefill/decode layout: prefill "
                f"{fleet_text(d['prefill'])} + decode {fleet_text(d['decode'])} = "
                f"{_gpus(d.get('gpus_total'))}{_cost(d.get('cost_per_hour'))}, TTFT p99 "
                f"{_ms(d.get('ttft_p99_s'), '.0f')} ms end to end, TBT p99 "
                f"{_ms(d.get('tbt_p99_s'), '.1f')} ms; the best aggregated fleet (rank 1) "
                f"needs {fleet_text(best)}")
    if layout == SEPARATE:
        sep = plan["pools"]["separate"]
        lanes = "; ".join(f"lane {ln.get('lane')}: {fleet_text(ln)}" for ln in sep["lanes"])
        return (f"recommended: a pool per lane, as the plan asks: {lanes} ("
                f"{_gpus(sep.get('gpus_total'))} in all{_cost(sep.get('cost_per_hour'))}); "
                f"rank 1 is one shared pool, for comparison: {fleet_text(best)}")
    # the disaggregated comparison's verdict is its own section's (each report prints it
    # there, once), as when the disaggregated layout wins
    return f"recommended: {fleet_text(best)}"


def disagg_figures(d: dict[str, Any]) -> str:
    """The layout's end-to-end TTFT and TBT, ratio and KV transfer in a sentence ("" without
    pools)."""
    if not isinstance(d.get("prefill"), dict):
        return ""
    tx = d.get("kv_transfer_s") or {}
    return (f"TTFT p99 {_ms(d.get('ttft_p99_s'), '.0f')} ms end to end (prefill + KV "
            f"transfer + decode admission), TBT p99 {_ms(d.get('tbt_p99_s'), '.1f')} ms; ratio "
            f"{d.get('ratio')} (prefill:decode); KV transfer {_ms(tx.get('mean'), '.2f')} ms "
            f"mean, {_ms(tx.get('p99'), '.2f')} ms p99 over {d.get('kv_link')}.")


def sentence(text: str) -> str:
    """`text` with its first letter a capital (the rest as it is, unlike str.capitalize)."""
    return text[:1].upper() + text[1:]


COMPARISON_TITLE = ("for comparison, instead of the lanes' pools: one shared pool (rank 1), "
                    "whose lines reuse the lanes' pools' GPUs and ports, then hosts no running "
                    "pool uses (run one layout or the other, never both)")
"""What every output says above the shared pool's launch lines when a pool per lane is
recommended: an alternative placed on the GPUs and ports of its own lanes' pools, then past
every fleet that runs (docs/takeaways.md, plan/pool_day.py), not a fleet to launch beside
them."""


HOSTS_TITLE = "where each replica runs"
"""The end of the title of `disagg_launch`'s one line that is not a command (reports print it
as text, not as a code block)."""

def disagg_launch(d: dict[str, Any]) -> list[tuple[str, str]]:
    """(title, text) of each launch line of the layout: a pool's, one per replica as each runs
    (`launch_replicas`: its GPUs, ports and hosts; a pool of one its `launch` line without the
    "1 x: " count), the front end's, and where each replica runs (not a command: its title
    says so)."""
    from capplan.models.engine import engine_display_name
    from capplan.plan.launch import pool_command

    out = []
    each = d.get("launch_replicas") or {}
    for key, line in (d.get("launch") or {}).items():
        engine, _, role = key.partition("_")
        name = engine_display_name(engine)
        pool = d.get(role) if role in ("prefill", "decode") else None
        if role == "hosts":
            out.append((f"{name}, {HOSTS_TITLE}", str(line)))
        elif key in each:
            out += [(f"{name} {role} {i} ({r['hosts']})", str(r["command"]))
                    for i, r in enumerate(each[key])]
        elif isinstance(pool, dict):
            out.append((f"{name} {role} (1 replica)", pool_command(str(line))))
        else:
            out.append((f"{name} {role}", str(line)))
    return out


def unverified_text(rec: dict[str, Any]) -> str:
    """What a recommendation without a simulator check says: "not simulated", unless the
    simulator's replay set its capacity or replicas (a binding ending in "(replay)") without
    replaying this fleet at its rate."""
    from capplan.plan.search import replay_found

    if replay_found(str(rec.get("binding_constraint", ""))):
        return "its capacity comes from the simulator's replay (this fleet was not replayed)"
    return "not simulated"


FIXED_TITLE = "the plan's fixed disaggregated layout"
"""What every output calls a plan file's `disaggregated_layout` (JSON `fixed_disaggregated`)."""
PD_POOL_HEADERS = (("pool", "pool"), ("workers", "workers"), ("gpus", "GPUs/worker"),
                   ("rate", "req/s per worker"), ("cap", "pool capacity (req/s)"),
                   ("util", "utilization"), ("mean", "prefill stage or TBT mean (ms)"),
                   ("p99", "prefill stage or TBT p99 (ms)"))
PD_LATENCY_HEADERS = (("metric", "latency"), *((q, f"{q} (ms)") for q in (
    "mean", "p50", "p90", "p99")))


def _pd_ms(x: Any) -> str:
    x = jsonable(x)
    return "-" if not isinstance(x, int | float) or x != x or abs(x) == float("inf") \
        else f"{s_to_ms(x):.1f}"


def pd_pool_rows(res: dict[str, Any]) -> list[dict[str, Any]]:
    """A fixed P/D layout's pools as the terminal prints them (PD_POOL_HEADERS' keys): workers,
    GPUs, rate and capacity, utilization (a saturated pool says so), the pool's own latency."""
    rows = []
    for role in ("prefill", "decode"):
        p = res["pools"][role]
        lat = p.get("ttft_s") if role == "prefill" else p.get("tbt_s")
        rows.append({"pool": role, "workers": p["workers"], "gpus": p["gpus_per_worker"],
                     "rate": f"{p['requests_per_s_per_worker']:.3g}",
                     "cap": f"{p['capacity_requests_per_s']:.3g}",
                     "util": f"{100 * p['utilization']:.0f}%"
                     + (" SATURATED" if role in (res.get("saturated_pools") or []) else ""),
                     "mean": _pd_ms(lat and lat["mean"]), "p99": _pd_ms(lat and lat["p99"])})
    return rows


def pd_latency_rows(res: dict[str, Any]) -> list[dict[str, Any]]:
    """A fixed P/D layout's composed latencies (PD_LATENCY_HEADERS' keys), in ms."""
    return [{"metric": name, **{q: _pd_ms((res.get(key) or {}).get(q))
                                for q in ("mean", "p50", "p90", "p99")}}
            for key, name in (("ttft_s", "TTFT"), ("tbt_s", "TBT"), ("e2e_s", "E2E"),
                              ("kv_transfer_s", "KV transfer"))]


def pd_overhead_note(res: dict[str, Any]) -> list[str]:
    """What a pool row's prefill stage leaves out: the request overhead, which TTFT and E2E
    count once (latency and simulate alike)."""
    if res.get("request_overhead_s") is None:
        return []
    return [f"prefill stage: queue and prompt, sent to prefill done; the request overhead "
            f"({s_to_ms(res['request_overhead_s']):.1f} ms) is counted once in TTFT and E2E, "
            "not in the pool rows"]


PD_HOSTS = "hosts"
"""The launch line of a fixed layout that is not a command: where each worker runs."""


def pd_launch_lines(res: dict[str, Any], plan_json: Any = None) -> list[tuple[str, str]]:
    """A fixed P/D layout's launch lines, (name, line) one per host (the router's and the
    hosts' too), and its verify steps (dataset, verify: the whole workload through the front
    end; measure: the verify call that reads the run back), their plan JSON `plan_json` when
    the run wrote one (else PLAN.json)."""
    from capplan.plan.bench_cmds import STEP_LABELS, reading_plan, verify_call

    out = [(name, str(line)) for name, lines in (res.get("launch") or {}).items()
           for line in (lines if isinstance(lines, list) else [lines])]
    out += [(label, str(res[key])) for key, label in STEP_LABELS.items() if res.get(key)]
    if res.get("bench"):
        out.append(("measure", f"{verify_call()} --layout disaggregated --endpoint "
                               f"{bench_url(res['bench'])}"))
    return [(name, reading_plan(line, plan_json)) for name, line in out]


def fixed_layout_sections(plan: dict[str, Any], plan_json: Any = None
                          ) -> list[tuple[str, list[str], list[list[Any]]]]:
    """A plan file's fixed disaggregated layout as the exports show it ([] without one), each
    part (title, headers, rows): its pools, its latencies, its layout and load (dtypes,
    calibration, the request overhead's note), its launch and verify lines (`plan_json`: the
    plan JSON the run wrote, which the verify lines read); the terminal's figures
    (`_pd.pd_table`)."""
    res = plan.get("fixed_disaggregated")
    if not isinstance(res, dict) or not isinstance(res.get("pools"), dict):
        return []
    es = (res["pools"].get("prefill") or {}).get("engine_settings") or {}
    facts = [["layout", f"{res.get('model')}: {res.get('layout')}"],
             ["dtypes", f"weights {es.get('weight_dtype')}, KV cache {es.get('kv_dtype')}"],
             ["load", str(res.get("load"))], ["bound", str(res.get("bound"))],
             ["calibration", str(res.get("calibration"))],
             *(["note", n] for n in pd_overhead_note(res))]
    if res.get("saturated_pools"):
        facts.append(["saturated", ", ".join(res["saturated_pools"])])
    return [("pools", [h for _, h in PD_POOL_HEADERS],
             [[r[k] for k, _ in PD_POOL_HEADERS] for r in pd_pool_rows(res)]),
            ("latencies", [h for _, h in PD_LATENCY_HEADERS],
             [[r[k] for k, _ in PD_LATENCY_HEADERS] for r in pd_latency_rows(res)]),
            ("layout", ["what", "value"], facts),
            ("launch and verify lines", ["line", "command"],
             [list(x) for x in pd_launch_lines(res, plan_json)])]
