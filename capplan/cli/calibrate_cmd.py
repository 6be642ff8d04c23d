"""`capplan calibrate`: measure a GPU/CPU, a running server, or saved benchmark results."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import click

from capplan import limits
from capplan.catalog.loader import load_catalog
from capplan.cli._options import (
    ENGINE,
    POS_INT,
    SECONDS,
    BoundedInt,
    IntList,
    catalog_option,
    format_option,
)
from capplan.cli._render import Column, emit, render_rows, to_json
from capplan.errors import InputError
from capplan.units import s_to_ms

ENDPOINT_TOKENS = BoundedInt(limits.ENDPOINT_TOKENS)

_STEP_COLUMNS = [
    Column("kind", "step"), Column("batch", "batch"), Column("context_len", "context/chunk"),
    Column("measured_s", "measured (ms)", s_to_ms, ".3f"),
    Column("before_s", "default model (ms)", s_to_ms, ".3f"),
    Column("after_s", "calibrated (ms)", s_to_ms, ".3f"),
]


def _stat_ms(key: str, stat: str) -> Column:
    return Column(f"{key}.{stat}", f"{key.split('_')[0].upper()} {stat} (ms)", s_to_ms, ".2f")


_LEVEL_COLUMNS = [
    Column("concurrency", "concurrency"), Column("completed", "done"), Column("errors", "errors"),
    _stat_ms("ttft_s", "mean"), _stat_ms("ttft_s", "p50"), _stat_ms("ttft_s", "p99"),
    _stat_ms("tbt_s", "mean"), _stat_ms("tbt_s", "p50"), _stat_ms("tbt_s", "p99"),
    _stat_ms("e2e_s", "mean"),
    Column("output_tokens_per_s", "output tok/s", None, ".1f"),
    Column("requests_per_s", "req/s", None, ".3f"),
]


_ROUND_TRIP_COLUMNS = [
    Column("concurrency", "concurrency"), Column("forward_model", "model"),
    Column("tbt_measured_s", "TBT measured (ms)", s_to_ms, ".2f"),
    Column("tbt_predicted_s", "TBT predicted (ms)", s_to_ms, ".2f"),
    Column("ttft_measured_s", "TTFT measured (ms)", s_to_ms, ".2f"),
    Column("ttft_predicted_s", "TTFT predicted (ms)", s_to_ms, ".2f"),
]


def _flat(level: dict[str, Any]) -> dict[str, Any]:
    out = dict(level)
    for k in ("ttft_s", "tbt_s", "e2e_s"):
        for stat, v in (level.get(k) or {}).items():
            out[f"{k}.{stat}"] = v
    return out


@click.command("calibrate")
@click.option("--device", type=click.Choice(["cuda", "cpu"]), default="cuda", show_default=True,
              help="Where to run the microbenchmarks.")
@click.option("--model", default=None,
              help="Model whose shapes are measured (default llama-3.1-8b; cpu: llama-3.2-1b). "
                   "With --endpoint: the served model name, and the catalog model the fit "
                   "uses (unless --served-model).")
@click.option("--served-model", default=None,
              help="With --endpoint/--from-results: the model name the server serves (its "
                   "--served-model-name), when --model names the catalog model.")
@click.option("--gpu", default=None,
              help="With --endpoint/--from-results: the server's GPU, to derive overheads.")
@click.option("--out", type=click.Path(dir_okay=False), default=None,
              help="Calibration YAML to write (default calibration-<gpu>.yaml).")
@click.option("--quick", is_flag=True, help="Fewer sizes: under 2 minutes.")
@click.option("--force", is_flag=True, help="Measure even if other processes use the GPU.")
@click.option("--layers", type=POS_INT, default=None,
              help="Decoder layers to run (scaled to the full depth).")
@click.option("--endpoint", default=None, help="Base URL of an OpenAI-compatible server.")
@click.option("--concurrency", type=IntList(limits.ENDPOINT_CONCURRENCY), default="1,8,32",
              show_default=True,
              help="Closed-loop client counts, one level each.")
@click.option("--input-len", type=ENDPOINT_TOKENS, default=512, show_default=True,
              help="Prompt length in tokens (about).")
@click.option("--output-len", type=ENDPOINT_TOKENS, default=128, show_default=True,
              help="max_tokens per request (ignore_eos).")
@click.option("--requests-per-level", type=POS_INT, default=None,
              help="Requests per level (default: 4 x concurrency, at least 8).")
@click.option("--timeout", type=SECONDS, default=60.0, show_default=True,
              help="Per-request timeout in seconds (also the stall timeout between events).")
@click.option("--from-results", "from_results", multiple=True, type=click.Path(dir_okay=False),
              help="Benchmark results files, any mix: vllm bench serve --save-result, "
                   "GuideLLM report, LLMPerf summary, AIPerf / genai-perf export or AIPerf "
                   "profile_export.jsonl, SGLang bench_serving JSONL.")
@click.option("--engine", type=ENGINE, default="vllm", show_default=True,
              help="With --endpoint/--from-results and --gpu: the engine (and release, "
                   "options) the server ran; its latency model is the one fitted.")
@click.option("--tp", type=POS_INT, default=1, show_default=True,
              help="With --endpoint/--from-results and --gpu: the server's tensor-parallel "
                   "size.")
@click.argument("more_results", nargs=-1, type=click.Path(dir_okay=False))
@format_option
@catalog_option
def calibrate_cmd(device: str, model: str | None, served_model: str | None, gpu: str | None,
                  out: str | None, quick: bool,
                  force: bool, layers: int | None, endpoint: str | None,
                  concurrency: list[int], input_len: int, output_len: int,
                  requests_per_level: int | None, timeout: float,
                  from_results: tuple[str, ...], more_results: tuple[str, ...], engine: str,
                  tp: int, fmt: str, catalog_dir: tuple[str, ...]) -> None:
    """Measure step times and fit a calibration file (or benchmark a running server).

    \b
      capplan calibrate --device cuda --model llama-3.1-8b --out h100.yaml
      capplan calibrate --device cpu --quick
      capplan calibrate --endpoint http://localhost:8000 --model meta-llama/Llama-3.1-8B
      capplan calibrate --from-results vllm-result.json guidellm-report.json
    """
    files = [*from_results, *more_results]
    if served_model is not None and not (endpoint or files):
        raise InputError("--served-model goes with --endpoint (the name its requests carry) "
                         "or --from-results (the name the files give --model)")
    if more_results and not from_results:
        raise InputError(f"unexpected argument {more_results[0]!r}: files go after --from-results")
    if endpoint and files:
        raise InputError("--endpoint and --from-results are exclusive: pick one")
    cat = load_catalog(catalog_dir)
    from capplan.plan.deployment import EngineOptions  # the command's own modules load here

    server = (model, gpu, EngineOptions(engine=engine, tp=tp), served_model)
    if endpoint:
        if not model:
            raise InputError("--endpoint needs --model NAME (the model the server serves)")
        from capplan.probe.endpoint import Interrupted, run_endpoint

        if out:  # checked before the benchmark: its minutes are not lost at the end
            _check_levels_out(out, model, gpu, cat, output_len)
        try:
            levels = run_endpoint(endpoint, served_model or model, concurrency, input_len,
                                  output_len, requests_per_level, timeout)
        except Interrupted as e:
            _interrupted(e.levels, len(concurrency), server, cat, fmt, out)
        done = any(lv.get("completed") for lv in levels)
        _emit_levels(levels, server, cat, fmt, out if done else None)
        _fail_if_nothing_completed(levels, endpoint)  # --out left as it was
        return
    if files:
        levels = _read_results(files)
        _emit_levels(levels, server, cat, fmt, out)
        return
    _device(device, model, out, quick, force, layers, cat, fmt)


def _check_levels_out(out: str, model: str, gpu: str | None, cat: Any, output_len: int
                      ) -> None:
    """What writing a levels calibration to `out` needs, before any request is sent."""
    from capplan.export.atomic import check_writable

    if output_len < 2:
        raise InputError(f"--out fits TBT from the token gaps, and --output-len {output_len} "
                         "gives each request one token, no gap: --output-len 2 or more")
    if not gpu:
        raise InputError("--out with --endpoint needs --gpu G (the server's GPU) to derive "
                         "calibration parameters; add it or drop --out")
    cat.gpu(gpu)
    cat.model(model)  # a catalog model (or its Hugging Face id) to derive overheads
    check_writable(Path(out))


def _read_results(files: list[str]) -> list[dict[str, Any]]:
    """Levels from results files, each checked: a file of the right shape with wrong values
    (NaN, negative latencies) or of a shape the readers do not know is bad input."""
    from capplan.probe.results import load_results

    levels: list[dict[str, Any]] = []
    for f in files:
        try:
            got = load_results([Path(f)])
        except InputError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError, IndexError,
                ZeroDivisionError, OverflowError) as e:
            from capplan.probe.results import FORMATS

            raise InputError(f"{f}: a field of the wrong shape ({type(e).__name__}: "
                             f"{str(e)[:80]}); capplan reads {FORMATS}") from e
        for lv in got:
            _check_level(lv, f)
        levels += got
    _one_model(levels)
    return sorted(levels, key=lambda lv: lv["concurrency"])


def _one_model(levels: list[dict[str, Any]]) -> None:
    """One latency law is fitted over all levels: files of different served models (or GPUs,
    where a file records one) measure different laws and are refused."""
    for key in ("model", "gpu"):
        seen: dict[str, str] = {}
        for lv in levels:
            if lv.get(key):
                seen.setdefault(str(lv[key]), str(lv.get("file", "?")))
        if len(seen) > 1:
            shown = "; ".join(f"{f}: {m}" for m, f in list(seen.items())[:3])
            raise InputError(f"results files of different {key}s ({shown}): one law is fitted "
                             f"per {key}; calibrate each {key}'s files on their own")


def _check_level(level: dict[str, Any], source: str) -> None:
    """Every number of a level finite and >= 0; concurrency a positive integer."""
    conc = level.get("concurrency")
    if isinstance(conc, bool) or not isinstance(conc, int) or conc < 1:
        raise InputError(f"{source}: concurrency {str(conc)[:20]} is not a positive integer")
    for key, v in level.items():
        vals = v.items() if isinstance(v, dict) else [("", v)]
        for stat, x in vals:
            if isinstance(x, int | float) and not isinstance(x, bool) and not (
                    math.isfinite(x) and x >= 0):
                name = f"{key}.{stat}" if stat else key
                raise InputError(f"{source}: {name} is {x:g} at concurrency {conc}; a "
                                 "latency, rate or count must be a finite number >= 0")


def _interrupted(levels: list[dict[str, Any]], planned: int, served: tuple[Any, ...],
                 cat: Any, fmt: str, out: str | None) -> None:
    """Ctrl-C: print the levels that finished, write nothing, say so, exit 130."""
    if levels:
        try:
            _emit_levels(levels, served, cat, fmt, None)
        except InputError as e:  # too few levels to fit: still say what happened
            click.echo(f"note: {e}", err=True)
    kept = f"; {out} left as it was" if out else ""
    click.echo(f"interrupted: {len(levels)} of {planned} levels finished, no fit written"
               f"{kept}", err=True)
    sys.exit(130)


def _fail_if_nothing_completed(levels: list[Any], endpoint: str) -> None:
    """Partial results were printed; if no request at all completed, that is an error."""
    rows = [lv if isinstance(lv, dict) else getattr(lv, "__dict__", {}) for lv in levels]
    done = sum(int(r.get("completed", r.get("requests", 0)) or 0) for r in rows)
    if rows and done == 0:
        kinds: dict[str, int] = {}
        for r in rows:
            for k, v in (r.get("error_kinds") or {}).items():
                kinds[k] = kinds.get(k, 0) + v
        what = ", ".join(f"{k} x{v}" for k, v in kinds.items()) or "no response"
        raise InputError(f"{endpoint}: every request failed ({what}); is it an "
                         "OpenAI-compatible server serving that model?")


def _device(device: str, model: str | None, out: str | None, quick: bool, force: bool,
            layers: int | None, cat: Any, fmt: str) -> None:
    from capplan.catalog.calibration import write_calibration
    from capplan.probe.run import calibration_file, fit_run, run_device

    spec = cat.model(model or ("llama-3.2-1b" if device == "cpu" else "llama-3.1-8b"))
    run = run_device(spec, device, quick, layers, force, cat, progress=True)
    gpu, cal, fit = fit_run(run, spec)
    cf = calibration_file(run, gpu, cal, fit)
    path = Path(out or f"calibration-{gpu.key}.yaml")
    write_calibration(path, cf)
    if fmt == "json":
        emit(to_json({"calibration_file": str(path), "gpu": gpu.key, "params": cf.params
                      .model_dump(), "fit": cf.fit, "rows": fit.rows if fit else [],
                      "skipped": run.skipped, "interrupted": run.interrupted}))
        return
    if fit is not None:
        emit(render_rows(fit.rows, _STEP_COLUMNS, fmt))
        emit(f"\nfit over {fit.n_samples} steps: median error {fit.before['median_rel_error']:.1%}"
             f" -> {fit.after['median_rel_error']:.1%}, worst {fit.before['worst_rel_error']:.1%}"
             f" -> {fit.after['worst_rel_error']:.1%}")
    else:
        emit("no decoder step was measured: the file holds the microbenchmark fractions only")
    params = ", ".join(f"{k}={v:.4g}" for k, v in cf.params.model_dump().items() if v is not None)
    emit(f"params: {params}")
    by: dict[str, list[str]] = {}
    for k, how in (cf.fit.get("param_sources") or {}).items():
        by.setdefault(how.split(" (")[0], []).append(k)
    emit("; ".join(f"{how}: {', '.join(ks)}" for how, ks in by.items()))
    for s in run.skipped:
        click.echo(f"skipped: {s}", err=True)
    for w in fit.warnings if fit is not None else ():
        click.echo(f"warning: {w}", err=True)
    if run.interrupted:
        click.echo("interrupted: kept what was measured", err=True)
    emit(f"wrote {path} (gpu {gpu.key})")


def _emit_levels(levels: list[dict[str, Any]], served: tuple[Any, ...], cat: Any,
                 fmt: str, out: str | None) -> None:
    """Print the levels and their fit; `served`: (model, GPU, EngineOptions, served name) of the
    server."""
    from capplan.probe.results import fit_levels

    model, gpu, options, served_model = served
    fit = fit_levels(levels, model, gpu, cat, options, served_model)
    _print_levels(levels, fit, fmt)  # printed before the file is written (or fails to be)
    if out:
        from capplan.probe.results import write_levels_calibration

        write_levels_calibration(Path(out), levels, fit)
        if fmt != "json":
            emit(f"wrote {out}")


def _print_levels(levels: list[dict[str, Any]], fit: dict[str, Any], fmt: str) -> None:
    for w in [*(f"concurrency {lv['concurrency']}: {w}" for lv in levels
                for w in lv.get("warnings") or ()), *(fit.get("warnings") or ())]:
        click.echo(f"warning: {w}", err=True)
    if fmt == "json":
        emit(to_json({"levels": levels, "fit": fit}))
        return
    failed = [lv for lv in levels if lv.get("first_error")]
    cols = _LEVEL_COLUMNS + ([Column("first_error", "first error")]
                             if failed and fmt != "table" else [])
    emit(render_rows([_flat(lv) for lv in levels], cols, fmt))
    if fmt == "table":  # the cause of the errors, one line a level (a column would be too wide)
        for lv in failed:
            emit(f"first error at concurrency {lv['concurrency']}: {lv['first_error']}")
    law = fit.get("tbt_law") or {}
    if law:
        emit(f"\nTBT ~ {s_to_ms(law['intercept_s']):.3f} ms + "
             f"{s_to_ms(law['per_concurrency_s']):.4f} ms x concurrency")
    if fit.get("centre"):
        emit(f"fitted on the {fit['centre']}")
    if any(lv.get("open_loop") for lv in levels):
        emit("open-loop runs: concurrency = mean requests in the system by Little's law "
             "(queued included)")
    for k, v in (fit.get("calibration_params") or {}).items():
        emit(f"{k} = {v:.4g}")
    if fit.get("note"):
        emit(fit["note"])
    if fit.get("round_trip"):
        emit("\nthe calibration predicting its own levels (measured -> predicted):")
        emit(render_rows(fit["round_trip"], _ROUND_TRIP_COLUMNS, fmt))


def register(cli: click.Group) -> None:
    cli.add_command(calibrate_cmd)
