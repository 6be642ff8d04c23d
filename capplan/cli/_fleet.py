"""Fleet options of simulate: replicas behind a router, a schedule, start-up lag
(docs/fleet.md)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from capplan.cli._options import SECONDS_OR_0, BoundedInt
from capplan.cli._render import Column, render_rows
from capplan.plan.fleet_sim import REPLICAS, FleetOptions, parse_schedule
from capplan.sim.fleet import ROUTERS

_KEYS = ("replicas", "router", "schedule", "startup_lag", "slo_ttft", "slo_tbt")


def fleet_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """Add --replicas, --router, --schedule, --startup-lag."""
    opts = [
        click.option("--replicas", type=BoundedInt(REPLICAS), default=1, show_default=True,
                     help="Identical replicas behind a router (fleet-wide and per-replica "
                          "results)."),
        click.option("--router", default="least-outstanding", show_default=True,
                     help=f"How requests reach replicas: {', '.join(ROUTERS)} (least_loaded "
                          "is least-outstanding; vLLM production stack, llm-d; "
                          "docs/fleet.md)."),
        click.option("--schedule", default=None,
                     help="Replica count per window, START_S:REPLICAS,... (e.g. "
                          "0:2,900:5,1800:3); replicas join after --startup-lag, leave by "
                          "draining. Per-window results."),
        click.option("--startup-lag", type=SECONDS_OR_0, default=0.0, show_default=True,
                     help="Seconds from a scale-up (its window's start) until the new replica "
                          "serves."),
        click.option("--slo-ttft", type=SECONDS_OR_0, default=None,
                     help="Fleet runs: a request meets its SLO with TTFT at most this (s); "
                          "per-window attainment."),
        click.option("--slo-tbt", type=SECONDS_OR_0, default=None,
                     help="Fleet runs: ... and TPOT at most this (s)."),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def pop_fleet_options(kw: dict[str, Any]) -> FleetOptions | None:
    """The FleetOptions of the options in kw (removed from it); None for one replica."""
    v = {k: kw.pop(k, None) for k in _KEYS}
    opts = FleetOptions(replicas=int(v["replicas"] or 1), router=v["router"] or ROUTERS[1],
                        schedule=parse_schedule(v["schedule"]) if v["schedule"] else (),
                        startup_lag_s=float(v["startup_lag"] or 0.0),
                        slo_ttft_s=v["slo_ttft"], slo_tbt_s=v["slo_tbt"])
    if not opts.is_fleet and (v["slo_ttft"] is not None or v["slo_tbt"] is not None):
        raise click.UsageError("--slo-ttft and --slo-tbt go with --replicas or --schedule")
    return opts if opts.is_fleet else None


def render_fleet(res: dict[str, Any], fmt: str) -> str:
    """Per replica (and per window for a schedule) as tables."""
    per = [{"replica": i, **p} for i, p in enumerate(res.get("per_replica", []))]
    cols = [Column("replica", "replica"), Column("requests", "requests", fmt=",d")]
    if per and "ready_at_s" in per[0]:
        cols += [Column("ready_at_s", "ready at (s)", fmt=",.1f"),
                 Column("stop_at_s", "drains from (s)", fmt=",.1f")]
    if per and "overloaded" in per[0]:  # open loops: each replica's own backlog test
        cols.append(Column("overloaded", "overloaded"))
    out = [render_rows(per, cols, fmt)]
    if res.get("windows"):
        wcols = [Column("start_s", "start (s)", fmt=",.0f"),
                 Column("end_s", "end (s)", fmt=",.0f"), Column("replicas", "replicas"),
                 Column("offered_rps", "offered (req/s)", fmt=",.2f"),
                 Column("served_rps", "served (req/s)", fmt=",.2f"),
                 Column("ttft_p99_s", "TTFT p99 (ms)", lambda v: v * 1e3, ",.1f"),
                 Column("tbt_p99_s", "TBT p99 (ms)", lambda v: v * 1e3, ",.1f"),
                 Column("attainment", "SLO met (%)", lambda v: 100 * v, ",.1f"),
                 Column("unfinished", "unfinished", fmt=",d")]
        out.append(render_rows(res["windows"], wcols, fmt))
    return "\n\n".join(out)
