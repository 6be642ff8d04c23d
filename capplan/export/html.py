"""A plan as one self-contained HTML page to share (`--export FILE.html`): inputs, the
recommendation and runner-ups, binding constraints, SLO margins, latency-vs-load and cost charts
as inline SVG, the launch / verify / deploy commands with copy buttons, and what was assumed.

No network: no external script, style, font or image; a Content-Security-Policy forbids any
fetch. Built from the plan dict (never recomputed). The page is a list of sections
(`SECTIONS`); a further table or chart is one more function appended to it.
"""

from __future__ import annotations

import hashlib
import html
import math
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from capplan.export.csv_export import (
    SHOWN_RECOMMENDATIONS,
    RecColumn,
    disaggregated_table,
    lane_table,
    pool_table,
    shown_note,
    stops_paying_text,
)
from capplan.export.layout import (
    AGGREGATED,
    COMPARISON_TITLE,
    DISAGGREGATED,
    FIXED_TITLE,
    HOSTS_TITLE,
    SEPARATE,
    disagg_figures,
    disagg_launch,
    fixed_layout_sections,
    fleet_text,
    headline,
    recommended_layout,
    sentence,
    unverified_text,
)
from capplan.models.engine import ENGINES, engine_display_name
from capplan.plan.alternatives import PLAN_NOTES
from capplan.plan.bench_cmds import STEP_LABELS, bench_url, lane_steps, reading_plan, verify_call
from capplan.plan.flags import launch_text, runnable
from capplan.plan.launch import layout_cell, sized_for

Section = Callable[[dict[str, Any]], str]


@dataclass(frozen=True)
class Run:
    """The run that made the report: its command line (`capplan recommend ...`) and the
    exports it wrote, which the report's commands name (its deploy line repeats the command,
    or applies the manifests it exported; its verify lines read the JSON it exported)."""

    command: str | None = None
    exports: tuple[str, ...] = ()

    def export(self, suffix: str) -> str | None:
        """The first export of the run whose name ends in suffix, else None."""
        return next((e for e in self.exports if e.lower().endswith(suffix)), None)

COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b")
_CSP = ("default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; "
        "img-src data:; connect-src 'none'; form-action 'none'")
_STYLE = """
body{font:14px/1.45 system-ui,sans-serif;margin:24px auto;max-width:1100px;color:#222;
padding:0 16px}
h1{font-size:22px}h2{font-size:17px;margin-top:28px;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:8px 0}td,th{border:1px solid #ddd;padding:3px 8px;
text-align:right}th{background:#f4f4f4}td.l,th.l{text-align:left}
.cmd{display:flex;gap:8px;align-items:flex-start;margin:6px 0}
.cmd pre{flex:1;margin:0;padding:6px 8px;background:#f6f8fa;border:1px solid #ddd;
white-space:pre-wrap;word-break:break-all;font-size:12px}
button{cursor:pointer}.ok{color:#1a7f37}.bad{color:#cf222e}svg{background:#fff}
.charts{display:flex;flex-wrap:wrap;gap:16px}
"""
_SCRIPT = """
function capplanCopy(id, btn){
  var text = document.getElementById(id).textContent;
  function done(){
    btn.textContent = 'copied'; setTimeout(function(){ btn.textContent = 'copy'; }, 1500);
  }
  function fallback(){
    var r = document.createRange(); r.selectNodeContents(document.getElementById(id));
    var s = window.getSelection(); s.removeAllRanges(); s.addRange(r);
    try { document.execCommand('copy'); done(); } catch (e) { btn.textContent = 'select + Ctrl-C'; }
  }
  if (navigator.clipboard && window.isSecureContext) {
    navigator.clipboard.writeText(text).then(done, fallback);
  } else { fallback(); }
}
"""


def _e(x: Any) -> str:
    return html.escape(str(x), quote=True)


def _num(x: Any, fmt: str = ".3g") -> str:
    return "" if x is None else format(x, fmt) if isinstance(x, (int, float)) else _e(x)


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]], left: int = 1) -> str:
    th = "".join(f'<th class="{"l" if i < left else ""}">{_e(h)}</th>'
                 for i, h in enumerate(headers))
    body = "".join("<tr>" + "".join(f'<td class="{"l" if i < left else ""}">{c}</td>'
                                    for i, c in enumerate(r)) + "</tr>" for r in rows)
    return f"<table><tr>{th}</tr>{body}</table>"


def _ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """Round tick values covering [lo, hi] (1, 2, 5 x 10^k steps)."""
    span = hi - lo if hi > lo else abs(hi) or 1.0
    raw = span / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    start = math.floor(lo / step) * step
    return [start + i * step for i in range(int(math.ceil((hi - start) / step)) + 1)]


def line_chart(title: str, series: Sequence[tuple[str, Sequence[tuple[float, float]]]],
               x_label: str, y_label: str, hline: tuple[str, float] | None = None,
               w: int = 520, h: int = 300) -> str:
    """An inline SVG line chart with axes, ticks, a legend and an optional dashed line."""
    pts = [p for _, s in series for p in s]
    if not pts:
        return ""
    ys = [y for _, y in pts] + ([hline[1]] if hline else [])
    xt, yt = _ticks(0.0, max(x for x, _ in pts)), _ticks(0.0, max(ys) * 1.05)
    x0, x1, y0, y1 = 60, w - 20, h - 45, 30

    def sx(x: float) -> float:
        return x0 + (x - xt[0]) / ((xt[-1] - xt[0]) or 1) * (x1 - x0)

    def sy(y: float) -> float:
        return y0 - (y - yt[0]) / ((yt[-1] - yt[0]) or 1) * (y0 - y1)

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" role="img" class="chart" width="{w}" '
           f'height="{h}" viewBox="0 0 {w} {h}"><title>{_e(title)}</title>',
           f'<text x="{w / 2}" y="18" text-anchor="middle" font-size="13">{_e(title)}</text>',
           f'<line x1="{x0}" y1="{y0}" x2="{x1}" y2="{y0}" stroke="#333"/>',
           f'<line x1="{x0}" y1="{y0}" x2="{x0}" y2="{y1}" stroke="#333"/>']
    for t in xt:
        out.append(f'<text x="{sx(t):.1f}" y="{y0 + 15}" text-anchor="middle" '
                   f'font-size="11">{t:g}</text>')
    for t in yt:
        out.append(f'<line x1="{x0}" y1="{sy(t):.1f}" x2="{x1}" y2="{sy(t):.1f}" '
                   f'stroke="#eee"/><text x="{x0 - 6}" y="{sy(t) + 4:.1f}" text-anchor="end" '
                   f'font-size="11">{t:g}</text>')
    out.append(f'<text x="{(x0 + x1) / 2}" y="{h - 8}" text-anchor="middle" '
               f'font-size="12">{_e(x_label)}</text>')
    out.append(f'<text x="14" y="{(y0 + y1) / 2}" text-anchor="middle" font-size="12" '
               f'transform="rotate(-90 14 {(y0 + y1) / 2})">{_e(y_label)}</text>')
    if hline:
        out.append(f'<line x1="{x0}" y1="{sy(hline[1]):.1f}" x2="{x1}" y2="{sy(hline[1]):.1f}" '
                   f'stroke="#cf222e" stroke-dasharray="5,4"/><text x="{x1}" '
                   f'y="{sy(hline[1]) - 4:.1f}" text-anchor="end" font-size="11" '
                   f'fill="#cf222e">{_e(hline[0])}</text>')
    for i, (label, s) in enumerate(series):
        c = COLORS[i % len(COLORS)]
        path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in s)
        out.append(f'<polyline class="series" fill="none" stroke="{c}" stroke-width="2" '
                   f'points="{path}"/>')
        out.append(f'<text x="{x0 + 10}" y="{y1 + 14 * (i + 1)}" font-size="11" '
                   f'fill="{c}">{_e(label)}</text>')
    return "".join(out) + "</svg>"


def bar_chart(title: str, bars: Sequence[tuple[str, float]], y_label: str,
              w: int = 520, h: int = 300) -> str:
    """An inline SVG bar chart (one bar per label)."""
    if not bars:
        return ""
    yt = _ticks(0.0, max(v for _, v in bars) * 1.05)
    x0, x1, y0, y1 = 60, w - 20, h - 70, 30
    bw = (x1 - x0) / len(bars)

    def sy(y: float) -> float:
        return y0 - y / (yt[-1] or 1) * (y0 - y1)

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" role="img" class="chart" width="{w}" '
           f'height="{h}" viewBox="0 0 {w} {h}"><title>{_e(title)}</title>',
           f'<text x="{w / 2}" y="18" text-anchor="middle" font-size="13">{_e(title)}</text>',
           f'<line x1="{x0}" y1="{y0}" x2="{x1}" y2="{y0}" stroke="#333"/>']
    for t in yt:
        out.append(f'<line x1="{x0}" y1="{sy(t):.1f}" x2="{x1}" y2="{sy(t):.1f}" '
                   f'stroke="#eee"/><text x="{x0 - 6}" y="{sy(t) + 4:.1f}" text-anchor="end" '
                   f'font-size="11">{t:g}</text>')
    for i, (label, v) in enumerate(bars):
        x = x0 + i * bw + bw * 0.15
        c = COLORS[0] if i == 0 else "#9ab"
        out.append(f'<rect class="series" x="{x:.1f}" y="{sy(v):.1f}" width="{bw * 0.7:.1f}" '
                   f'height="{y0 - sy(v):.1f}" fill="{c}"><title>{_e(label)}: {v:.2f}</title>'
                   f'</rect><text x="{x + bw * 0.35:.1f}" y="{y0 + 14}" text-anchor="middle" '
                   f'font-size="10">{_e(label)}</text>')
    out.append(f'<text x="14" y="{(y0 + y1) / 2}" text-anchor="middle" font-size="12" '
               f'transform="rotate(-90 14 {(y0 + y1) / 2})">{_e(y_label)}</text>')
    return "".join(out) + "</svg>"


def _inputs(p: dict[str, Any]) -> str:
    inp = p.get("inputs", {})
    lane_cols, lane_rows = lane_table(p)
    facts = [("model", p.get("hf_id") or p.get("model")), ("target rate (req/s)",
                                                           p.get("target_rate_per_s")),
             ("objective", p.get("objective")), ("headroom", p.get("headroom")),
             ("engine", inp.get("engine")), ("GPUs searched", ", ".join(inp.get("gpus", []))),
             ("configurations searched", p.get("configurations_searched"))]
    return ("<h2>Inputs</h2>" + _table(["", "value"], [[_e(k), _e(v)] for k, v in facts], 2)
            + _cols_table(lane_cols, lane_rows, 4))


def _cols_table(cols: Sequence[RecColumn], rows: Sequence[Sequence[Any]], left: int) -> str:
    """A table of capplan.export.csv_export columns (the other formats' headers and formats)."""
    return _table([c.header for c in cols],
                  [[_num(v, c.fmt) for c, v in zip(cols, r, strict=True)] for r in rows], left)


def _features(r: dict[str, Any]) -> str:
    """A recommendation's engine features: draft length and where speculation stops paying,
    LoRA slots, images per request ('' without)."""
    f, spec = r.get("features") or {}, r.get("speculation") or {}
    out = []
    if f.get("speculative"):
        stops = stops_paying_text(spec)
        out.append(f"{f['speculative']} K={f.get('spec_tokens')}"
                   + (f" (stops paying at batch {stops})" if isinstance(stops, int) else
                      f" (stops paying: {stops})" if stops else ""))
    if f.get("max_loras"):
        out.append(f"LoRA {f['max_loras']} slots, rank {f.get('max_lora_rank')}")
    if f.get("images_per_request"):
        out.append(f"{f['images_per_request']} image(s) per request")
    return "; ".join(out)


def _ms(x: float | None) -> float | None:
    return None if x is None else x * 1e3


def _recommendations(p: dict[str, Any]) -> str:
    recs = p["recommendations"]
    rows = []
    features = any(_features(r) for r in recs)
    for r in recs[:SHOWN_RECOMMENDATIONS]:
        pred = r.get("predicted", {})
        margins = ", ".join(f"{k} {v:+.0%}" for k, v in (r.get("slo_margins") or {}).items())
        rows.append([f"#{r.get('rank', '')}", _e(r["gpu"]), _e(layout_cell(r)), r["replicas"],
                     r["gpus_total"], _e(f"{r.get('weight_dtype_resolved', r['weight_dtype'])}"
                                         f"/{r.get('kv_dtype_resolved', r['kv_dtype'])}"),
                     r["max_num_seqs"], r["max_num_batched_tokens"],
                     _num(_ms(pred.get("ttft_s", {}).get("p99")), ".0f"),
                     _num(_ms(pred.get("tbt_s", {}).get("p99")), ".1f"),
                     _num(r.get("cost_per_hour"), ".2f"), _e(r.get("binding_constraint", "")),
                     _e(margins), _e(r.get("why_not_first") or "")]
                    + ([_e(_features(r))] if features else []))
    note = shown_note(p)
    return ("<h2>Recommendation and runner-ups</h2>" + _head(p) + _table(
        ["#", "GPU", "TP", "replicas", "GPUs", "weights/KV", "max seqs", "chunk (tok)",
         "TTFT p99 (ms)", "TBT p99 (ms)", "cost ($/h)", "binding constraint", "SLO margins",
         "why not first", *(["features"] if features else [])], rows, 2)
            + (f"<p>{_e(sentence(note))}.</p>" if note else ""))


def _head(p: dict[str, Any]) -> str:
    """What the plan recommends (`layout.headline`: the aggregated fleet, the disaggregated
    layout when it wins, a pool per lane), then the table's rank 1: its capacity, binding
    constraint and simulator check."""
    best = p["recommendations"][0]
    ver = best.get("verified")
    vtxt = (unverified_text(best) if not ver else "the simulator confirms the SLOs"
            if ver.get("ok")
            else f"simulator: {ver.get('reason')}")
    cls = "ok" if ver and ver.get("ok") else "bad" if ver else ""
    layout = recommended_layout(p)
    head = headline(p)
    if layout == AGGREGATED:  # the disaggregated verdict is in its own section, once
        lead = f"<b>Recommended: {_e(fleet_text(best))}</b>"
        rank1 = "each replica"
    else:
        what, _, rest = head.removeprefix("recommended: ").partition(": ")
        where = ("its section below" if layout == DISAGGREGATED else "the pools table below")
        lead = f"<b>Recommended: {_e(what)}</b> ({where}): {_e(rest)}"
        rank1 = (f"rank 1 of the table below, "
                 f"{'the best aggregated fleet' if layout == DISAGGREGATED else 'one shared pool'}"
                 ": each replica")
    return (f'<p class="headline">{lead}.</p><p>{_e(sentence(rank1))} up to '
            f"{_num(best.get('capacity_per_replica_rps'))} req/s, bound by "
            f"<b>{_e(best.get('binding_constraint', ''))}</b>; "
            f'<span class="{cls}">{_e(vtxt)}</span>.</p>')


def _disaggregated(p: dict[str, Any]) -> str:
    """The disaggregated layout ('' when none was sized): whether it is recommended, the
    verdict, each pool (the other formats' columns), its end-to-end figures, and its launch
    and verify lines with copy buttons."""
    d = p.get("disaggregated") or {}
    if not d:
        return ""
    won = recommended_layout(p) == DISAGGREGATED
    cols, rows = disaggregated_table(p, brief=True)
    out = [f"<h2>Disaggregated prefill/decode ({'recommended' if won else 'not recommended'})"
           f'</h2><p class="verdict">{_e(d.get("verdict", ""))}</p>']
    if rows:
        out.append(_cols_table(cols, rows, 1))
    if disagg_figures(d):
        out.append(f"<p>{_e(disagg_figures(d))}</p>")
    for title, text in disagg_launch(d):
        out.append(f"<p>{_e(title)}: {_e(text)}</p>" if title.endswith(HOSTS_TITLE)
                   else _cmd(title, text))
    for key, label in STEP_LABELS.items():
        if d.get(key):
            out.append(_cmd(f"P/D {label}", d[key]))
    if d.get("bench"):  # the P/D layout through its front end, the whole workload
        out.append(_cmd("P/D measure", f"{verify_call()} --layout disaggregated "
                        f"--endpoint {bench_url(d['bench'])}"))
    return "".join(out)


def _fixed_layout(p: dict[str, Any]) -> str:
    """A plan file's fixed disaggregated layout ('' without one): its pools, latencies, layout,
    launch and verify lines, as the terminal prints them (layout.fixed_layout_sections)."""
    parts = fixed_layout_sections(p)
    if not parts:
        return ""
    out = [f"<h2>{_e(sentence(FIXED_TITLE))}</h2>"]
    for title, headers, rows in parts:
        if title.startswith("launch"):
            out += [_cmd(name, line) for name, line in rows]
        else:
            out.append(_table(headers, [[_e(c) for c in r] for r in rows], 1))
    return "".join(out)


def _pools(p: dict[str, Any], model: str | None = None) -> str:
    """One shared pool against a pool per lane ('' without the comparison); `model`: one model
    of a plan of several, which its lanes' measure lines name (bench_cmds.verify_call)."""
    cols, rows = pool_table(p)
    if not rows:
        return ""
    out = "<h2>Pools: one shared pool against a pool per lane</h2>" + _cols_table(cols, rows, 2)
    if recommended_layout(p) != SEPARATE:
        return out
    # the recommended pools' own lines (the launch section below gives the shared pool's)
    for ln in ((p.get("pools") or {}).get("separate") or {}).get("lanes") or []:
        flags = ln.get("engine_flags") or {}
        out += "".join(_cmd(f"lane {ln.get('lane')}: {engine_display_name(key)}",
                            launch_text(flags, key)) for key in ENGINES if flags.get(key))
        lane = str(ln.get("lane"))  # its own verify steps: its requests alone, at its rate
        out += "".join(_cmd(f"lane {lane}: {label}", line)
                       for _, label, line in lane_steps(flags, lane, measure=True,
                                                        model=model))
    return out


def _charts(p: dict[str, Any]) -> str:
    curves = p.get("curves") or []
    slo_t = min((ln["ttft_p99_s"] for ln in p.get("lanes", []) if ln.get("ttft_p99_s")),
                default=None)
    slo_b = min((ln["tbt_p99_s"] for ln in p.get("lanes", []) if ln.get("tbt_p99_s")),
                default=None)
    # TTFT grows without bound near capacity: show up to 4x the SLO; a point without a figure
    # (no steady state: null in the JSON, or infinite) is left out
    cap = 4 * slo_t if slo_t else math.inf

    def series(key: str, top: float) -> list[tuple[str, list[tuple[float, float]]]]:
        return [(c["label"], [(q["rate_per_s"], q[key] * 1e3) for q in c["points"]
                              if q.get(key) is not None and math.isfinite(q[key])
                              and q[key] <= top]) for c in curves]

    ttft, tbt = series("ttft_p99_s", cap), series("tbt_p99_s", math.inf)
    costs = [(f"#{r.get('rank', i + 1)}", r["cost_per_hour"])
             for i, r in enumerate(p["recommendations"][:SHOWN_RECOMMENDATIONS])
             if r.get("cost_per_hour") is not None]
    charts = [line_chart("TTFT p99 vs load (one replica)", ttft, "requests/s per replica",
                         "TTFT p99 (ms)", ("SLO", slo_t * 1e3) if slo_t else None),
              line_chart("TBT p99 vs load (one replica)", tbt, "requests/s per replica",
                         "TBT p99 (ms)", ("SLO", slo_b * 1e3) if slo_b else None),
              bar_chart("Fleet cost per configuration (# as in the table)", costs,
                        "$ per hour")]
    return '<h2>Latency vs load, and cost</h2><div class="charts">' + "".join(charts) + "</div>"


def _cmd(label: str, text: str) -> str:
    text = runnable(text)  # what the copy button gives: commands, labels as shell comments
    i = "cmd-" + hashlib.sha1(f"{label}\n{text}".encode()).hexdigest()[:12]
    return (f'<div class="cmd"><b style="min-width:110px">{_e(label)}</b><pre id="{i}">'
            f'{_e(text)}</pre><button type="button" onclick="capplanCopy(\'{i}\', this)">copy'
            "</button></div>")


def _commands(p: dict[str, Any], run: Run | None = None, model: str | None = None) -> str:
    """The aggregated fleet's launch and verify lines, and the deploy line of the recommended
    layout (the disaggregated layout's own lines are in its section); `model`: one model of a
    plan of several, which its verify lines name (bench_cmds.verify_call), and whose deploy
    line is the whole plan's, given once after the models (`render_html`)."""
    flags = p["recommendations"][0].get("engine_flags", {})
    out = ["<h2>Launch, verify, deploy</h2>"]
    if recommended_layout(p) == DISAGGREGATED:
        out.append("<p>The lines of the aggregated fleet (rank 1); the recommended "
                   "disaggregated layout's are in its section above.</p>")
    elif recommended_layout(p) == SEPARATE:
        out.append(f"<p>{_e(sentence(COMPARISON_TITLE))}; the recommended pool per lane's "
                   "launch and verify lines are in the pools' section above.</p>")
    for key in ENGINES:
        if flags.get(key):  # a fleet of several replicas as it runs on hosts
            out.append(_cmd(engine_display_name(key), launch_text(flags, key)))
        for name, text in flags.items():
            if name.startswith(f"file:{key}:"):
                out.append(_cmd(name.split(":", 2)[2], text))
    best = p["recommendations"][0]
    if best.get("engine"):
        sized = sized_for(best).replace("sized for: ", "Sized for ", 1)
        out.append(f"<p>{_e(sized)}.</p>")
    if recommended_layout(p) != SEPARATE:  # else each lane's pool's, in the pools' section
        for key, label in STEP_LABELS.items():
            if flags.get(key):
                out.append(_cmd(label, flags[key]))
        out.append(_cmd("measure",
                        f"{verify_call(model)} --endpoint {bench_url(flags.get('bench'))}"))
    return "".join(out) + ("" if model else _deploy(run))


def _deploy(run: Run | None) -> str:
    """kubectl applying the manifests of the run's `.k8s.yaml` export, or of the same command
    run again with one; a report written without its command (`export_plan`) says where the
    manifests come from."""
    k8s = run.export(".k8s.yaml") if run else None
    if k8s:
        return _cmd("deploy", f"kubectl apply -f {shlex.quote(k8s)}")
    if run and run.command:
        return _cmd("deploy", f"{run.command} --export plan.k8s.yaml && "
                              "kubectl apply -f plan.k8s.yaml")
    return ("<p>Deploy: export this plan's Kubernetes manifests with <code>--export "
            "plan.k8s.yaml</code> on the command that made it, then:</p>"
            + _cmd("deploy", "kubectl apply -f plan.k8s.yaml"))


def _assumptions(p: dict[str, Any]) -> str:
    best = p["recommendations"][0]
    inp = p.get("inputs", {})
    items = [f"calibration: {best.get('calibration', '')}"]
    if inp.get("max_model_len_reason"):
        items.append(inp["max_model_len_reason"])
    for key in PLAN_NOTES:
        if (p.get(key) or {}).get("note"):
            items.append(p[key]["note"])
    items += [f"warning: {w}" for w in p.get("warnings", [])]
    return "<h2>Assumptions</h2><ul>" + "".join(f"<li>{_e(x)}</li>" for x in items) + "</ul>"


def _day(p: dict[str, Any]) -> str:
    """A day plan's schedule and its chart (capplan.export.day_export)."""
    from capplan.export.day_export import has_day, html_section

    return html_section(p, _table, line_chart, _num) if has_day(p) else ""


SECTIONS: list[Section] = [_inputs, _recommendations, _disaggregated, _fixed_layout, _pools,
                           _charts,
                           _commands, _assumptions, _day]


def render_html(plan: dict[str, Any], run: Run | None = None) -> str:
    """The report; `run`: the command that made the plan and its exports (the report's verify
    and deploy lines name them), None when unknown."""
    from capplan.export.csv_export import model_plans, rates_title

    subs = model_plans(plan)
    title = "capplan: " + rates_title(plan)

    def sections(p: dict[str, Any], model: str | None = None) -> str:
        # the verify lines of one model of several name it (bench_cmds.verify_call)
        named = {_commands: lambda q: _commands(q, run, model),
                 _pools: lambda q: _pools(q, model)}
        return "".join(named.get(s, s)(p) for s in SECTIONS if s is not _day)

    if len(subs) == 1:
        body = sections(plan) + _day(plan)
    else:  # several models: each model's sections under its own heading, the deploy line of
        # their one manifest file once, then the pool's day
        body = "".join(f"<h2>Model: {_e(m.get('model'))}</h2>"
                       + sections(m, str(m.get("model"))).replace("<h2>", "<h3>")
                       .replace("</h2>", "</h3>") for m in subs) + _deploy(run) + _day(plan)
    # the verify lines read the plan's JSON: the one this run wrote
    body = reading_plan(body, run.export(".json") if run else None, _e)

    return ("<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
            f'<meta http-equiv="Content-Security-Policy" content="{_CSP}">'
            f"<title>{_e(title)}</title><style>{_STYLE}</style><script>{_SCRIPT}</script>"
            f"</head><body><h1>{_e(title)}</h1>{body}</body></html>\n")
