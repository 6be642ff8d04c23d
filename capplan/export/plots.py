"""Charts (matplotlib, the `plot` extra), each written as PNG and SVG.

matplotlib is imported lazily and used through its object API with the Agg canvas, so nothing
here touches pyplot's global state or the user's configured backend. SVG text is kept as text
(not paths) so labels can be searched and edited. Every file goes through `atomic_write_all`;
the folder must exist (as an export's).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from capplan.errors import InputError
from capplan.export.atomic import Staged, atomic_write_all
from capplan.units import s_to_ms

FORMATS = ("png", "svg")
TTFT_MS = "p99 TTFT (ms)"
TBT_MS = "p99 TBT (ms)"
OUTPUT_TPS = "output throughput (tokens/s)"
COST_PER_HOUR = r"cost (\$/hour)"  # \$: a literal dollar, never mathtext
TIME_S = "time (s)"
KV_USED_PCT = "KV cache used (%)"


def _figure(ncols: int = 1, nrows: int = 1, **kw: Any) -> tuple[Any, Any]:
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as e:
        raise InputError("matplotlib is not installed, run `pip install capplan[plot]`") from e
    fig = Figure(figsize=(5.2 * ncols, 3.6 * nrows + 0.6), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(nrows, ncols, squeeze=False, **kw)
    return fig, axes


def _charts(fig: Any, out_dir: Path, stem: str) -> list[Staged]:
    """The figure as `stem`.png and `stem`.svg in out_dir, to write (`atomic_write_all`)."""
    import matplotlib

    def write(tmp: Path, fmt: str) -> None:
        # Date=None keeps the SVG byte-stable between runs; fonttype none keeps text as text.
        meta = {"Date": None} if fmt == "svg" else {}
        with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "capplan"}):
            fig.savefig(tmp, format=fmt, metadata=meta)

    return [(out_dir / f"{stem}.{fmt}", lambda tmp, fmt=fmt: write(tmp, fmt)) for fmt in FORMATS]


def _save(fig: Any, out_dir: Path, stem: str) -> list[Path]:
    return atomic_write_all(_charts(fig, out_dir, stem))


def chart_folder(out_dir: str | Path) -> Path:
    """The folder charts go to, as --export's folder: it must exist (InputError otherwise)."""
    out = Path(out_dir)
    if not out.is_dir():
        raise InputError(f"{out} is a file; give a folder for the charts" if out.exists() else
                         f"chart folder {out} does not exist: create it, or give an existing "
                         "folder")
    return out


def plan_chart_stems(day: bool = False) -> list[str]:
    """The charts `plot_plan` draws (a day plan adds its schedule's)."""
    return ["throughput_latency", "pareto", "tokens_per_gpu"] + ["day_schedule"] * day


def check_charts(out_dir: str | Path, stems: Iterable[str]) -> Path:
    """Before the work whose charts go to out_dir: the folder exists and takes every chart's
    files (stem.png, stem.svg: each absent or a regular file)."""
    from capplan.export.atomic import check_writable

    out = chart_folder(out_dir)
    for stem in stems:
        for fmt in FORMATS:
            check_writable(out / f"{stem}.{fmt}")
    return out


def _num(x: Any) -> float | None:
    """A finite float, or None (missing, null, inf, nan, not a number)."""
    if isinstance(x, bool | str) or x is None:
        return None
    try:
        x = float(x)  # numpy scalars too
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def _ms(x: Any) -> float | None:
    v = _num(x)
    return None if v is None else s_to_ms(v)


def _dig(d: Any, *path: str) -> Any:
    for key in path:
        if not isinstance(d, dict):
            return None
        d = d.get(key)
    return d


def _pairs(xs: Iterable[float | None], ys: Iterable[float | None]
           ) -> tuple[list[float], list[float]]:
    kept = [(x, y) for x, y in zip(xs, ys, strict=False) if x is not None and y is not None]
    return [x for x, _ in kept], [y for _, y in kept]


def _legend(ax: Any, **kw: Any) -> None:
    handles, _ = ax.get_legend_handles_labels()
    if handles:  # an empty legend() call warns, and tests run with warnings as errors
        ax.legend(fontsize="small", **kw)


def _no_data(ax: Any, what: str) -> None:
    ax.text(0.5, 0.5, f"no {what} in this result", ha="center", va="center",
            transform=ax.transAxes, color="0.4")


def _slo_lines(ax: Any, lanes: list[dict[str, Any]], key: str, name: str) -> None:
    seen: set[float] = set()
    for lane in lanes:
        ms = _ms(lane.get(key))
        if ms is None or ms in seen:
            continue
        seen.add(ms)
        label = f"{name} SLO {ms:g} ms" + (f" ({lane['name']})" if lane.get("name") else "")
        ax.axvline(ms, color="tab:red", linestyle="--", linewidth=1.2, label=label)


def _first(plan: dict[str, Any]) -> dict[str, Any] | None:
    recs = plan.get("recommendations") or []
    return recs[0] if recs and isinstance(recs[0], dict) else None


def _rec_label(rec: dict[str, Any]) -> str:
    parts = [str(rec.get("gpu", "?"))]
    if rec.get("tp") is not None:
        parts.append(f"tp{rec['tp']}")
    if rec.get("replicas") is not None:
        parts.append(f"x{rec['replicas']}")
    return "recommended: " + " ".join(parts)


def _throughput_axes(ax: Any, plan: dict[str, Any], lat_key: str, slo_key: str,
                     xlabel: str, name: str) -> None:
    curves = [c for c in plan.get("curves") or [] if isinstance(c, dict)]
    drawn = 0
    for i, curve in enumerate(curves):
        pts = [p for p in curve.get("points") or [] if isinstance(p, dict)]
        xs, ys = _pairs((_ms(p.get(lat_key)) for p in pts),
                        (_num(p.get("output_tokens_per_s")) for p in pts))
        if xs:
            ax.plot(xs, ys, marker="o", markersize=3.5, linewidth=1.4,
                    label=str(curve.get("label") or f"curve {i + 1}"))
            drawn += 1
    lanes = [ln for ln in plan.get("lanes") or [] if isinstance(ln, dict)]
    _slo_lines(ax, lanes, slo_key, name)
    rec = _first(plan)
    if rec is not None:
        stat = "ttft_s" if lat_key.startswith("ttft") else "tbt_s"
        x = _ms(_dig(rec, "predicted", stat, "p99"))
        y = _num(_dig(rec, "predicted", "output_tokens_per_s"))
        if x is not None and y is not None:
            ax.plot([x], [y], marker="*", markersize=15, color="black", linestyle="none",
                    label=_rec_label(rec), zorder=5)
            drawn += 1
    if not drawn:
        _no_data(ax, "load curves")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(OUTPUT_TPS)
    ax.grid(True, alpha=0.3)
    _legend(ax)


def _front_2d(points: list[tuple[float, float, Any]]) -> list[tuple[float, float, Any]]:
    """Points not dominated in (x, y), both lower-is-better, sorted by x: a point is dominated
    when another is no worse in both and better in one."""
    front = [p for p in points
             if not any(q[0] <= p[0] and q[1] <= p[1] and (q[0] < p[0] or q[1] < p[1])
                        for q in points)]
    return sorted(front, key=lambda t: (t[0], t[1]))


def _point_label(p: dict[str, Any]) -> str:
    dtypes = "/".join(str(p[k]) for k in ("weight_dtype", "kv_dtype") if p.get(k))
    cost = _num(p.get("cost_per_hour"))
    return (f"{p.get('gpu', '?')} TP{p.get('tp', '?')} x{p.get('replicas', '?')}"
            + (f" {dtypes}" if dtypes else "") + (f", \\${cost:.2f}/h" if cost is not None else ""))


def _pareto_axes(ax: Any, plan: dict[str, Any]) -> None:
    """Cost against p99 TTFT. The plan's front is 3-D (cost, TTFT, TBT); here only what no
    other point beats on both plotted axes is the front (numbered, named in the legend, joined
    by the staircase); the rest of the 3-D front (kept for a better TBT) is grey, unlabelled."""
    pts = [p for p in plan.get("pareto") or [] if isinstance(p, dict)]
    kept = [(x, y, p) for p in pts
            if (x := _ms(p.get("ttft_p99_s"))) is not None
            and (y := _num(p.get("cost_per_hour"))) is not None]
    front = _front_2d(kept)
    others = [k for k in kept if not any(k[2] is f[2] for f in front)]
    if others:
        ax.plot([o[0] for o in others], [o[1] for o in others], marker="o", linestyle="none",
                color="0.75", markersize=5, label="better TBT only (3-D front)")
    if front:
        xs, ys = [f[0] for f in front], [f[1] for f in front]
        ax.step(xs, ys, where="post", color="tab:blue", linewidth=1.0, alpha=0.6)
        for i, (x, y, p) in enumerate(front, start=1):
            # each point numbered on the chart and named in the legend (names would overlap)
            ax.plot([x], [y], marker="o", linestyle="none", color="tab:blue", markersize=5,
                    label=f"{i}: {_point_label(p)}")
        _number_points(ax, xs, ys)
    lanes = [ln for ln in plan.get("lanes") or [] if isinstance(ln, dict)]
    _slo_lines(ax, lanes, "ttft_p99_s", "TTFT")
    rec = _first(plan)
    if rec is not None:
        x = _ms(_dig(rec, "predicted", "ttft_s", "p99"))
        y = _num(rec.get("cost_per_hour"))
        if x is not None and y is not None:
            ax.plot([x], [y], marker="*", markersize=15, color="black", linestyle="none",
                    label=_rec_label(rec), zorder=5, alpha=0.6)
    if not kept:
        _no_data(ax, "Pareto points")
    ax.set_xlabel(TTFT_MS)
    ax.set_ylabel(COST_PER_HOUR)
    ax.grid(True, alpha=0.3)
    handles, _ = ax.get_legend_handles_labels()
    if handles:
        ax.legend(fontsize="x-small", loc="upper center", bbox_to_anchor=(0.5, -0.16), ncols=1)


def _number_points(ax: Any, xs: list[float], ys: list[float], near_px: float = 14.0) -> None:
    """Write 1, 2, ... next to the points without overlaps: points closer than near_px share
    one label ("1,2"); each label takes the first of four places around its point whose box
    meets no label placed before it (else the least crowded one)."""
    ax.autoscale_view()
    disp = ax.transData.transform(list(zip(xs, ys, strict=True)))
    groups: list[list[int]] = []
    for i, (px, py) in enumerate(disp):
        for g in groups:
            gx, gy = disp[g[0]]
            if math.hypot(px - gx, py - gy) < near_px:
                g.append(i)
                break
        else:
            groups.append([i])
    renderer = ax.figure.canvas.get_renderer()
    placed: list[Any] = []
    for g in groups:
        text = ",".join(str(i + 1) for i in g)
        best = None
        for dx, dy, ha, va in ((5, 5, "left", "bottom"), (5, -5, "left", "top"),
                               (-5, 5, "right", "bottom"), (-5, -5, "right", "top")):
            ann = ax.annotate(text, (xs[g[0]], ys[g[0]]), textcoords="offset points",
                              xytext=(dx, dy), ha=ha, va=va, fontsize="small",
                              color="tab:blue", fontweight="bold")
            box = ann.get_window_extent(renderer)
            hits = sum(box.overlaps(b) for b in placed)
            if best is None or hits < best[0]:
                if best is not None:
                    best[1].remove()
                best = (hits, ann, box)
            else:
                ann.remove()
            if hits == 0:
                break
        assert best is not None
        placed.append(best[2])


def _per_gpu_axes(ax: Any, plan: dict[str, Any]) -> None:
    """Output tokens/s per GPU against tokens/s per user (1 / mean TBT) as load rises, one line
    per curve: the trade-off deployments are compared on (InferenceMAX-style)."""
    drawn = 0
    for i, curve in enumerate(c for c in plan.get("curves") or [] if isinstance(c, dict)):
        gpus = _num(curve.get("gpus_per_replica"))
        pts = [p for p in curve.get("points") or [] if isinstance(p, dict)]
        xs, ys = _pairs((None if (t := _num(p.get("tbt_mean_s"))) is None or t <= 0 else 1 / t
                         for p in pts),
                        (None if gpus is None or (o := _num(p.get("output_tokens_per_s"))) is None
                         else o / gpus for p in pts))
        if xs:
            ax.plot(xs, ys, marker="o", markersize=3.5, linewidth=1.4,
                    label=str(curve.get("label") or f"curve {i + 1}"))
            drawn += 1
    if not drawn:
        _no_data(ax, "load curves with mean TBT")
    ax.set_xlabel("decode speed per user (tokens/s, 1 / mean TBT)")
    ax.set_ylabel("output throughput per GPU (tokens/s)")
    ax.grid(True, alpha=0.3)
    _legend(ax)


def plot_plan(plan: dict[str, Any], out_dir: str | Path) -> list[Path]:
    """Write throughput-vs-latency and cost-vs-TTFT (Pareto) charts as PNG and SVG, in the
    folder out_dir (which must exist), all or none.

    Files: ``throughput_latency.{png,svg}`` (output tokens/s against p99 TTFT and p99 TBT as load
    rises, one line per curve, lane SLOs dashed, rank 1 starred), ``pareto.{png,svg}`` (cost
    against p99 TTFT, the front in those two axes) and ``tokens_per_gpu.{png,svg}`` (tokens/s
    per GPU against tokens/s per user).

    Returns:
        The paths written, PNG before SVG for each chart.
    """
    return atomic_write_all(plan_chart_files(plan, out_dir))


def plan_chart_files(plan: dict[str, Any], out_dir: str | Path) -> list[Staged]:
    """`plot_plan`'s charts drawn, to write (`atomic_write_all`) with the plan's exports."""
    if not isinstance(plan, dict):
        raise InputError(f"a plan result must be a dict, got {type(plan).__name__}")
    out = chart_folder(out_dir)
    rec = _first(plan)
    who = _who({"model": plan.get("model"), **({"gpu": rec.get("gpu"), "tp": rec.get("tp")}
                                               if rec else {})})
    title = ": ".join(x for x in (who, "throughput against latency as load rises") if x)
    fig, axes = _figure(ncols=2)
    _throughput_axes(axes[0][0], plan, "ttft_p99_s", "ttft_p99_s", TTFT_MS, "TTFT")
    _throughput_axes(axes[0][1], plan, "tbt_p99_s", "tbt_p99_s", TBT_MS, "TBT")
    fig.suptitle(title)
    files = _charts(fig, out, "throughput_latency")
    fig, axes = _figure()
    fig.set_size_inches(6.4, 6.2)  # room under the axes for the numbered points' legend
    _pareto_axes(axes[0][0], plan)
    fig.suptitle(f"{plan.get('model', '')}: cost against p99 TTFT".lstrip(": "))
    files += _charts(fig, out, "pareto")
    fig, axes = _figure()
    _per_gpu_axes(axes[0][0], plan)
    fig.suptitle(": ".join(x for x in (plan.get("model"), "throughput per GPU against speed "
                                       "per user") if x))
    files += _charts(fig, out, "tokens_per_gpu")
    from capplan.export.day_export import has_day, plot_day

    if has_day(plan):  # a day plan: replicas and offered rate over the day
        files += plot_day(plan, out, _figure, _charts)
    return files


def _who(d: dict[str, Any]) -> str:
    """'llama-3.1-8b on h100-sxm (TP 2)' from a result's model/gpu/tp keys, as far as known."""
    text = str(d.get("model") or "")
    if d.get("gpu"):
        text += f" on {d['gpu']}" + (f" (TP {d['tp']})" if d.get("tp") else "")
    return text.strip()


def _knee(knees: dict[Any, Any], ctx: Any) -> float | None:
    for key, batch in knees.items():
        if str(key) == str(ctx):
            return _num(batch)
    return None


def plot_speed(curve: dict[str, Any], out_dir: str | Path) -> list[Path]:
    """Write ``speed.{png,svg}``: total and per-sequence decode tokens/s against batch size,
    one line per context length, the knee batch marked."""
    rows = curve.get("rows") if isinstance(curve, dict) else None
    if not isinstance(rows, list):
        raise InputError("a speed curve must be a dict with 'rows' (what `capplan speed` makes)")
    out = chart_folder(out_dir)
    knees = curve.get("knee_batch") or {}
    contexts = sorted({r.get("context_len") for r in rows if isinstance(r, dict)},
                      key=lambda c: (c is None, c if c is not None else 0))
    fig, axes = _figure(ncols=2)
    total_ax, seq_ax = axes[0]
    batches: list[float] = []
    for ctx in contexts:
        sel = sorted((r for r in rows if isinstance(r, dict) and r.get("context_len") == ctx),
                     key=lambda r: _num(r.get("batch")) or 0.0)
        label = f"context {ctx} tokens"
        for ax, key in ((total_ax, "tokens_per_s_total"), (seq_ax, "tokens_per_s_per_seq")):
            xs, ys = _pairs((_num(r.get("batch")) for r in sel), (_num(r.get(key)) for r in sel))
            if not xs:
                continue
            line = ax.plot(xs, ys, marker="o", markersize=3.5, label=label)[0]
            batches += xs
            knee = _knee(knees, ctx)
            if knee is not None and knee in xs:
                ax.plot([knee], [ys[xs.index(knee)]], marker="D", markersize=8, linestyle="none",
                        color=line.get_color(), markeredgecolor="black",
                        label=f"knee, context {ctx}")
    for ax, ylabel in ((total_ax, "decode throughput, all sequences (tokens/s)"),
                       (seq_ax, "decode speed per sequence (tokens/s)")):
        if batches and min(batches) > 0 and max(batches) / min(batches) >= 8:
            from matplotlib.ticker import FuncFormatter, NullFormatter

            ax.set_xscale("log", base=2)
            ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
            ax.xaxis.set_minor_formatter(NullFormatter())
        if not batches:
            _no_data(ax, "rows")
        ax.set_xlabel("batch size (sequences)")
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        _legend(ax)
    fig.suptitle(": ".join(x for x in (_who(curve), "decode speed against batch size") if x))
    return _save(fig, out, "speed")


def plot_sim(result: dict[str, Any], out_dir: str | Path,
             scheduler: str | None = None) -> list[Path]:
    """Write ``sim.{png,svg}``: KV-cache use (%) and running / waiting sequences over time;
    with `scheduler`, ``sim-<scheduler>.{png,svg}``, the title naming it (one chart per
    scheduler of `simulate --scheduler a,b`)."""
    ts = result.get("timeseries") if isinstance(result, dict) else None
    if not isinstance(ts, dict) or not isinstance(ts.get("time_s"), list | tuple):
        raise InputError("a simulation result needs 'timeseries' with a 'time_s' list "
                         "(run `capplan simulate` with its time series on)")
    out = chart_folder(out_dir)
    t = [_num(x) for x in ts["time_s"]]
    fig, axes = _figure(nrows=2, sharex=True)
    kv_ax, q_ax = axes[0][0], axes[1][0]
    kv = [None if (v := _num(x)) is None else 100.0 * v for x in ts.get("kv_utilization") or []]
    xs, ys = _pairs(t, kv)
    if xs:
        kv_ax.plot(xs, ys, color="tab:purple", linewidth=1.2, label="KV cache used")
        kv_ax.set_ylim(0, max(105.0, max(ys) * 1.05))
    else:
        _no_data(kv_ax, "KV-cache samples")
    for key, color in (("running", "tab:green"), ("waiting", "tab:orange")):
        xs, ys = _pairs(t, (_num(x) for x in ts.get(key) or []))
        if xs:
            q_ax.step(xs, ys, where="post", color=color, linewidth=1.2, label=key)
    kv_ax.set_ylabel(KV_USED_PCT)
    q_ax.set_ylabel("sequences (count)")
    q_ax.set_xlabel(TIME_S)
    for ax in (kv_ax, q_ax):
        ax.grid(True, alpha=0.3)
        _legend(ax, loc="upper right")
    title = ": ".join(x for x in (_who(result), "simulation over time") if x)
    fig.suptitle(title + (f"\n{scheduler} scheduler" if scheduler else ""))
    return _save(fig, out, f"sim-{scheduler}" if scheduler else "sim")


__all__ = ["plot_plan", "plot_sim", "plot_speed"]
