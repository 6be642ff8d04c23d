"""Fixed disaggregated-layout options of latency and simulate (docs/disaggregation.md):
--prefill-workers N --prefill-tp T ... --decode-workers M --decode-tp U ... --kv-link."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import click

from capplan.cli._options import CONCURRENCY, POS_INT
from capplan.cli._render import Column, render_rows
from capplan.plan.bench_cmds import step_lines
from capplan.units import MS_S

_ROLE_KEYS = ("workers", "tp", "pp", "attention_dp", "expert_parallel", "max_num_seqs",
              "max_num_batched_tokens", "gpu")


def pd_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """Add the prefill/decode pool options; a pool's unset layout falls back to --tp etc."""
    opts = []
    for role in ("prefill", "decode"):
        opts += [
            click.option(f"--{role}-workers", type=POS_INT, default=None,
                         help=f"Disaggregated: {role} workers (replicas); with the other "
                              "pool's workers this predicts a fixed P/D layout."),
            click.option(f"--{role}-tp", type=POS_INT, default=None,
                         help=f"TP of a {role} worker, in the engine's notation "
                              "(default --tp)."),
            click.option(f"--{role}-pp", type=POS_INT, default=None,
                         help=f"PP of a {role} worker (default --pp)."),
            click.option(f"--{role}-attention-dp", type=POS_INT, default=None,
                         help=f"Attention-DP ranks of a {role} worker (default "
                              "--attention-dp)."),
            click.option(f"--{role}-expert-parallel", type=POS_INT, default=None,
                         help=f"EP size of a {role} worker (default --expert-parallel)."),
            click.option(f"--{role}-max-num-seqs", type=POS_INT, default=None,
                         help=f"Max running sequences per {role} worker rank."),
            click.option(f"--{role}-max-num-batched-tokens", type=POS_INT, default=None,
                         help=f"Token budget of a {role} worker rank."),
            click.option(f"--{role}-gpu", default=None,
                         help=f"GPU of the {role} pool (default --gpu)."),
        ]
    opts.append(click.option("--kv-link", type=click.Choice(["auto", "nvlink", "network"]),
                             default="auto", show_default=True,
                             help="Disaggregated: the KV path from prefill to decode GPUs "
                                  "(auto: NVLink when both pools fit one NVLink domain)."))
    for role in ("prefill", "decode"):
        opts.append(click.option(
            f"--{role}-router", default="round-robin", show_default=True,
            help=f"Disaggregated replay: how the frontend places requests on the {role} "
                 "workers: round-robin (a counter, Dynamo's default), random (seeded) or "
                 "least-outstanding (fewest in flight; least_loaded is the same)."))
    opts.append(click.option("--peak-concurrency", type=CONCURRENCY, default=None,
                             help="Disaggregated, latency without worker counts: the clients "
                                  "the implied counts are sized for (a deployment's peak; "
                                  "default --concurrency)."))
    for o in reversed(opts):
        f = o(f)
    return f


def pop_pd(kw: dict[str, Any], implied: bool = False) -> dict[str, Any] | None:
    """The P/D arguments of capplan.api.disaggregated, or None when no pool was given.
    `implied`: pools given without either worker count leave both None (`latency` implies them
    from --concurrency, capplan.plan.pd.implied_workers)."""
    pools: dict[str, dict[str, Any]] = {}
    for role in ("prefill", "decode"):
        pools[role] = {k: kw.pop(f"{role}_{k}") for k in _ROLE_KEYS}
    link = kw.pop("kv_link")
    routers = {f"{r}_router": kw.pop(f"{r}_router") for r in ("prefill", "decode")}
    peak = kw.pop("peak_concurrency", None)
    workers = {r: p.pop("workers") for r, p in pools.items()}
    given = any(workers.values()) or any(v is not None for p in pools.values()
                                          for v in p.values())
    if peak is not None and not (implied and given and not any(workers.values())):
        raise click.UsageError("--peak-concurrency sizes the worker counts `latency` implies: "
                               "give it with the pools' layouts and without "
                               "--prefill-workers and --decode-workers")
    if not given:
        return None
    if implied and not any(workers.values()):
        pass
    elif not all(workers.values()):
        raise click.UsageError("a disaggregated layout needs both --prefill-workers and "
                               "--decode-workers" + (" (or neither, with --concurrency: "
                                                     "the counts a planner would deploy)"
                                                     if implied else ""))
    return {"prefill_workers": workers["prefill"], "decode_workers": workers["decode"],
            "prefill": {k: v for k, v in pools["prefill"].items() if v is not None},
            "decode": {k: v for k, v in pools["decode"].items() if v is not None},
            "kv_link": link, **routers,
            **({"peak_concurrency": peak} if peak is not None else {})}


def pd_table(res: dict[str, Any], fmt: str) -> str:
    """Per-pool rows, then the composed latencies; the layout and any saturated pool below."""
    from capplan.export.layout import (
        PD_LATENCY_HEADERS,
        PD_POOL_HEADERS,
        pd_latency_rows,
        pd_overhead_note,
        pd_pool_rows,
    )

    text = render_rows(pd_pool_rows(res), [Column(k, h) for k, h in PD_POOL_HEADERS], fmt)
    text += "\n\n" + render_rows(pd_latency_rows(res),
                                  [Column(k, h) for k, h in PD_LATENCY_HEADERS], fmt)
    if fmt == "table":
        notes = [f"{res['model']}: {res['layout']}", f"load: {res.get('load')}",
                 *pd_overhead_note(res)]
        if res["saturated_pools"]:
            notes.append("SATURATED: " + (res.get("reason") or (
                f"the closed loop queues at the {' and '.join(res['saturated_pools'])} pool "
                "(it runs at its capacity; TTFT is mostly that queue)")))
        notes.append(f"bound: {res['bound']}; calibration: {res.get('calibration')}")
        if res.get("answered_by"):
            notes.append(f"answered by: {res['answered_by']}"
                         + (f" ({res['replay_note']})" if res.get("replay_note") else ""))
        text += "\n\n" + "\n".join(_implied_note(res) + notes + _launch_notes(res))
    return text


def _implied_note(res: dict[str, Any]) -> list[str]:
    """The worker counts `latency` implied from the closed loop, when none were given."""
    imp = res.get("implied_workers")
    if not imp:
        return []
    peak = imp.get("peak_concurrency")
    sized = f" sized for a peak of {peak} clients" if peak is not None else ""
    return [f"worker counts implied from --concurrency{sized}: {imp['prefill']} prefill, "
            f"{imp['decode']} decode ({imp['rule']})"]


def _launch_notes(res: dict[str, Any]) -> list[str]:
    """The layout's launch lines, one per node (`latency` carries them, replayed or not)."""
    if not res.get("launch"):
        return []
    out = ["launch (one line per host; HOSTn: the address of the layout's host n, localhost "
           "when it runs on one; a worker on one host is pinned to its GPUs there, a worker "
           "over hosts is not pinned and takes the GPUs its hosts line names):"]
    for name, lines in res["launch"].items():
        out += [f"  {name}: {line}" for line in lines]
    if res.get("bench"):  # a plan file's layout: the whole workload through the front end
        out += step_lines(res)
    return out


def pd_sim_table(res: dict[str, Any], fmt: str) -> str:
    """`simulate` on a layout: per-pool rows (stage latencies, batch, KV, saturation), then
    the composed latencies; the layout and any saturated pool below."""
    from capplan.export.layout import pd_overhead_note

    def ms(x: Any) -> str:
        return "-" if x is None or not math.isfinite(x) else f"{x / MS_S:.1f}"

    rows = []
    for role in ("prefill", "decode"):
        p = res["pools"][role]
        stage = p["ttft_s"] if role == "prefill" else p["admission_s"]
        rows.append({"pool": role, "workers": p["workers"], "gpus": p["gpus_per_worker"],
                     "rate": f"{p['requests_per_s_per_worker']:.3g}",
                     "batch": f"{p['mean_running_batch']:.1f}",
                     "kv": ("-" if p["kv_peak_utilization"] is None
                            else f"{100 * p['kv_peak_utilization']:.0f}%"),
                     "queue": ms(p["queue_s"]["mean"]), "stage": ms(stage["mean"]),
                     "state": "SATURATED" if p["saturated"] else "stable"})
    cols = [Column("pool", "pool"), Column("workers", "workers"),
            Column("gpus", "GPUs/worker"), Column("rate", "req/s per worker"),
            Column("batch", "mean running batch"), Column("kv", "KV peak"),
            Column("queue", "queue mean (ms)"),
            Column("stage", "prefill stage or decode admission mean (ms)"),
            Column("state", "state")]
    text = render_rows(rows, cols, fmt)
    comp = [{"metric": name, **{q: ms((res.get(key) or {}).get(q))
                                for q in ("mean", "p50", "p90", "p99")}}
            for key, name in (("ttft_s", "TTFT"), ("tbt_s", "TBT"), ("tpot_s", "TPOT"),
                              ("e2e_s", "E2E"), ("kv_transfer_s", "KV transfer"))]
    text += "\n\n" + render_rows(comp, [Column("metric", "latency"),
                                        *(Column(q, f"{q} (ms)") for q in (
                                            "mean", "p50", "p90", "p99"))], fmt)
    if fmt == "table":
        notes = [f"{res['model']}: {res['layout']}",
                 f"load: {res.get('load')}{_replayed_count(res)}; "
                 f"{res['requests_per_s']:.3g} req/s, "
                 f"{res['output_tokens_per_s']:.4g} output tok/s", *pd_overhead_note(res)]
        if res["saturated_pools"]:
            notes.append("SATURATED: " + (res.get("reason") or (
                f"the {' and '.join(res['saturated_pools'])} pool (its queue grows with the "
                "run, or the clients wait mostly there)")))
        if not res.get("replay_settled", True):
            notes.append(res.get("replay_note") or
                         f"the closed loop did not settle in {res['replay_passes']} passes")
        notes.append(f"answered by: {res.get('answered_by')}; calibration: "
                     f"{res.get('calibration')}")
        text += "\n\n" + "\n".join(_implied_note(res) + notes + _launch_notes(res))
    return text


def _replayed_count(res: dict[str, Any]) -> str:
    """", N requests" of a run whose load line does not count its requests (a benchmark
    replay's states its measured and replayed requests)."""
    if "benchmark_replay" in res or "num_requests" not in res:
        return ""
    return f", {res['num_requests']} requests"

