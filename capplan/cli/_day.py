"""Day-plan options of `capplan recommend` (--trace, --rate-curve, --window, replica start-up)
and the day plan's table (the schedule and its totals)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import click

from capplan.cli._render import Column, render_rows
from capplan.units import bytes_to_gb

DAY_OPTIONS = (
    click.option("--trace", default=None, type=click.Path(dir_okay=False),
                 help="A trace (any format simulate --trace reads): plan a day of it, replicas "
                      "per window (instead of --rate)."),
    click.option("--time-unit", type=click.Choice(["auto", "s", "ms", "us"]), default="auto",
                 show_default=True, help="Numeric arrival times of --trace (auto: the unit "
                                         "the column's name states, else by schema and size)."),
    click.option("--rate-curve", default=None, type=click.Path(dir_okay=False),
                 help="A daily rate curve CSV (at,rate_per_s; HH:MM, linear between points) "
                      "with --input-len/--output-len (instead of --rate)."),
    click.option("--window", "window", default="15m", show_default=True,
                 help="Window of a day plan (e.g. 15m, 900, 1h)."),
    click.option("--min-replicas", type=click.IntRange(min=0), default=1, show_default=True,
                 help="Replicas kept in every window of a day plan."),
    click.option("--load-from", type=click.Choice(["nvme", "network"]), default="nvme",
                 show_default=True, help="Where a starting replica reads its weights."),
    click.option("--load-gb-per-s", type=click.FloatRange(min=0, min_open=True, max=1000),
                 default=None, help="Your storage's read rate (GB/s), over --load-from's."),
    click.option("--engine-startup", "engine_startup_s", type=click.FloatRange(0, 86_400),
                 default=60.0, show_default=True,
                 help="Engine start-up after loading (CUDA graphs, profiling), seconds."),
    click.option("--replay", type=click.Choice(["none", "peak", "all"]), default="peak",
                 show_default=True,
                 help="Windows of a day plan the fleet replay verifies (the trace, or "
                      "Poisson arrivals drawn from the rate curve)."),
    click.option("--timezone", default="UTC", show_default=True,
                 help="IANA time zone of a day plan's clock times (the rate curve's, the "
                      "schedule's, the Kubernetes CronJobs'), e.g. Europe/Berlin."),
)


def day_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """Decorate a command with the day-plan options (one block, added after the others)."""
    for opt in reversed(DAY_OPTIONS):
        f = opt(f)
    return f


def day_spec(kw: dict[str, Any]) -> dict[str, Any]:
    """Pop the day options from a command's keyword arguments: the plan file's `day:`."""
    from capplan.errors import InputError
    from capplan.plan.clock_zone import check_zone
    from capplan.units import parse_seconds

    try:
        window_s = parse_seconds(kw.pop("window"))
    except ValueError as e:
        raise InputError(f"--window: {e}") from None
    if not math.isfinite(window_s) or not 60 <= window_s <= 86_400:
        raise InputError(f"--window {window_s:g} s: use 60 s to 24 h")
    out = {"window_s": window_s}
    for k in ("min_replicas", "load_from", "load_gb_per_s", "engine_startup_s", "replay"):
        out[k] = kw.pop(k)
    out["timezone"] = check_zone(kw.pop("timezone"), "--timezone")
    return out


def hhmm(s: float, earlier: bool = False) -> str:
    """A clock time to the minute; `earlier`: rounded down (a scale-up at 06:58:39 shows
    06:58, never late)."""
    m = int(s // 60) if earlier else int(round(s / 60))
    return f"{m // 60:02d}:{m % 60:02d}"


def _ms(x: Any) -> Any:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else x * 1e3


def _attainment(w: dict[str, Any], which: str) -> str | None:
    """A replayed window's SLO attainment as a percentage; "-" where it has none (no
    arrivals), an empty cell where the window was not replayed."""
    r = (w.get("replay") or {}).get(which)
    if r is None:
        return None
    v = r.get("attainment")
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.1%}"


SCHEDULE_COLUMNS = [
    Column("start", "start"), Column("offered_rps", "req/s", None, ".3g"),
    Column("sizing_rps", "sized\nreq/s", None, ".3g"),
    Column("dispersion", "IDC", None, ".2f"), Column("arrival_scv", "gap\nSCV", None, ".2f"),
    Column("replicas", "replicas"), Column("gpus", "GPUs"),
    Column("ttft_p99_s", "TTFT p99\n(ms)", _ms, ".0f"),
    Column("tbt_p99_s", "TBT p99\n(ms)", _ms, ".1f"),
    Column("lead", "start\nscale-up"),
    Column("planned_att", "replay\nplanned"), Column("reactive_att", "replay\nreactive"),
    Column("binding", "bound\nby"),
]


def columns(result: dict[str, Any]) -> list[Column]:
    """The schedule's columns: one model's, or a pool's (GPUs per model and per GPU type's
    pool, no p99s)."""
    first = result["schedule"][0]
    models = list(first.get("gpus_by_model") or first.get("gpus_by_lane") or {})
    if not models:
        return SCHEDULE_COLUMNS
    types = list(result["schedule"][0].get("gpus_by_gpu") or {})
    return [Column("start", "start"), Column("offered_rps", "req/s", None, ".3g"),
            *(Column(f"gpus:{m}", f"GPUs\n{m}") for m in models),
            *(Column(f"pool:{t}", f"GPUs\n{t} pool") for t in types)]


def schedule_rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for w in result["schedule"]:
        begin = w.get("scale_up_begin_s")
        rows.append({**w, "start": hhmm(w["start_s"]),
                     **{f"gpus:{m}": n for m, n in _by_fleet(w).items()},
                     **{f"pool:{t}": n for t, n in (w.get("gpus_by_gpu") or {}).items()},
                     "lead": None if begin is None else hhmm(begin % 86_400, earlier=True),
                     "planned_att": _attainment(w, "planned"),
                     "reactive_att": _attainment(w, "reactive")})
    return rows


def _by_fleet(w: dict[str, Any]) -> dict[str, Any]:
    """A pool's window: GPUs per model, or per lane of a model's pools per lane."""
    return w.get("gpus_by_model") or w.get("gpus_by_lane") or {}


def _hours(x: float) -> str:
    return f"{x:,.1f}" if x >= 10 else f"{x:.3g}"


def _money(x: Any) -> str:
    return "unknown (no price)" if x is None else f"${x:,.2f}"


def schedule_sections(result: dict[str, Any], fmt: str) -> list[tuple[str, str]]:
    """(title, table) of the schedule and the totals in CSV or Markdown: the columns of the
    `.schedule.csv` export (capplan.export.day_export), so stdout and the file read alike."""
    from capplan.export.day_export import clock_times, headers, summary_rows, summary_shown
    from capplan.export.day_export import schedule_rows as export_rows

    heads, fmts = headers(result)
    cols = [Column(str(i), h, None, f) for i, (h, f) in enumerate(zip(heads, fmts, strict=True))]
    rows = [{str(i): v for i, v in enumerate(r)} for r in export_rows(result)]
    # CSV: the numbers as the .schedule.csv export writes them; Markdown: each in its format
    totals = ([{"q": q, "v": v} for q, v, _ in summary_rows(result)] if fmt == "csv"
              else [{"q": q, "v": v} for q, v in summary_shown(result)])
    return [(f"day plan (replicas per window), {clock_times(result)}",
             render_rows(rows, cols, fmt)),
            ("totals", render_rows(totals, [Column("q", "quantity"), Column("v", "value")],
                                   fmt))]


def render_day(result: dict[str, Any], fmt: str) -> str:
    """The schedule table and the day's totals (for one model or a pool of several)."""
    from capplan.export.day_export import clock_times

    out = ["", f"day plan (replicas per window), {clock_times(result)}:",
           render_rows(schedule_rows(result), columns(result), fmt)]
    if result.get("gpu_pools"):
        # a model's pools per lane: their totals together (each lane's are under its day)
        lanes = totals_lines(result, "each lane's pool fixed at its own peak") \
            if result.get("lane_days") else []
        return "\n".join(out + [_pool_line(p) for p in result["gpu_pools"]] + lanes)
    return "\n".join(out + day_lines(result))


def totals_lines(result: dict[str, Any], fixed_is: str = "a fixed fleet for the peak"
                 ) -> list[str]:
    """The day's totals: peak replicas, GPU-hours and cost autoscaled against the fixed
    fleet (`fixed_is` names it), $ per million output tokens."""
    out = []
    auto, fixed = result["gpu_hours"], result["fixed_fleet_gpu_hours"]
    save = 1 - auto / fixed if fixed else 0.0
    peak = result["peak_replicas"]
    out.append(f"peak {peak} replica{'' if peak == 1 else 's'}; autoscaled {_hours(auto)} "
               "GPU-hours "
               f"({_money(result.get('cost_per_day'))}/day) vs {fixed_is} "
               f"{_hours(fixed)} GPU-hours ({_money(result.get('fixed_fleet_cost_per_day'))}"
               f"/day): autoscaling saves {save:.0%}")
    if result.get("cost_per_million_output_tokens") is not None:
        out.append(f"$ per million output tokens: autoscaled "
                   f"{result['cost_per_million_output_tokens']:.3f}, fixed "
                   f"{result['fixed_fleet_cost_per_million_output_tokens']:.3f}")
    return out


def day_lines(result: dict[str, Any]) -> list[str]:
    """One model's day below its schedule: totals, replay, replica start-up, notes."""
    out = totals_lines(result)
    out += _replay_lines(result)
    day = result.get("day")
    if day:
        st = day["startup"]
        out.append(f"a replica starts in {st['replica_start_s']:.0f} s (weights "
                   f"{bytes_to_gb(st['weights_bytes']):.1f} GB from {st['load_from']} in "
                   f"{st['load_s']:.0f} s + engine start-up {st['engine_startup_s']:.0f} s): "
                   "each scale-up begins that long before its window ('start scale-up')")
        out += [f"note: {n}" for n in day.get("notes", [])]
    return out


def scale_up_line(result: dict[str, Any]) -> list[str]:
    """The windows that add replicas, each with when its scale-up begins (rounded down)."""
    ups = [f"{hhmm(w['scale_up_begin_s'] % 86_400, earlier=True)} (to {w['replicas']} for "
           f"{hhmm(w['start_s'])})" for w in result["schedule"]
           if w.get("scale_up_begin_s") is not None]
    return [f"scale-ups begin at: {', '.join(ups)}"] if ups else []


def _replay_lines(result: dict[str, Any]) -> list[str]:
    """Planned against reactive over the replayed windows: the worst attainment of each."""
    rep = [w["replay"] for w in result["schedule"] if w.get("replay")]
    if not rep:
        return []

    def worst(which: str) -> str:
        vals = [a for r in rep if (a := r[which].get("attainment")) is not None
                and not math.isnan(a)]
        met = all(r[which].get("meets_slo") for r in rep)
        return (f"{min(vals):.2%}" if vals else "n/a") + (
            ", SLOs met" if met else ", SLOs missed")

    replayed = [w for w in result["schedule"] if w.get("replay")]
    reactive = (f"reactive (scales after a short window, replicas join after the start-up) "
                f"{worst('reactive')}" if any(w["reactive_replicas"] != w["replicas"]
                                              for w in replayed) else
                "reactive not exercised (no replayed window changes its replicas: it runs "
                "the planned fleet)")
    return [f"replayed {len(rep)} window(s): lowest SLO attainment planned {worst('planned')}; "
            + reactive]


def _pool_line(p: dict[str, Any]) -> str:
    """A GPU type's pool: of several models, or of a model's pools per lane."""
    unit = "lane" if "lanes" in p else "model"
    # a fleet: a model's, or each lane's pool of a model deploying a pool per lane (pool_day)
    return (f"pool {p['gpu']} ({', '.join(p[unit + 's'])}): peak {p['peak_gpus']} GPUs shared "
            f"vs {p['separate_fleets_peak_gpus']} with each fleet at its own peak (saves "
            f"{p['saving_gpus']} GPUs); {p['gpu_hours']:,.1f} GPU-hours autoscaled, "
            f"{p['fixed_pool_gpu_hours']:,.1f} for a fixed pool at its peak, "
            f"{p['separate_fleets_gpu_hours']:,.1f} for fixed fleets each at its own peak") + (
        "\n    the launch lines above start each fleet at its own peak "
        f"({p['separate_fleets_peak_gpus']} GPUs together); scaled by its schedule (the "
        f"Kubernetes export's CronJobs) the pool never runs more than {p['peak_gpus']}"
        if p["saving_gpus"] else "")
