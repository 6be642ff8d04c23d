"""`capplan calibrate --device`: run the microbenchmarks and the decoder steps, fit, build the file.

The sizes are a plan (`make_plan`); each measurement is one step of a click progress bar on
stderr. Ctrl-C stops the run and keeps what was measured; an out-of-memory at one size skips
that size (bench.Bench.guarded).
"""

from __future__ import annotations

import datetime as _dt
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from capplan.catalog.calibration import CalibrationFile, CalibrationParams
from capplan.catalog.host import host_device_record
from capplan.catalog.schema import GpuSpec, ModelSpec
from capplan.errors import InputError, ProbeUnavailable
from capplan.models.calibration import Calibration, default_calibration
from capplan.probe import bench as bn
from capplan.probe import sources
from capplan.probe.decoder import RandomDecoder, check_supported
from capplan.probe.fit import FitResult, fit_calibration, host_gpu_spec, microbench_priors
from capplan.units import MIB_BYTES


@dataclass(frozen=True)
class SizePlan:
    copy_bytes: list[int]
    gemm_tokens: list[int]
    attn_decode: list[tuple[int, int]]
    attn_prefill: list[int]
    decode_batches: list[int]
    decode_contexts: list[int]
    prefill_chunks: list[int]
    layers: int


def make_plan(device: str, quick: bool, layers: int | None) -> SizePlan:
    """Sizes per device: a GPU sweeps tokens 1..1024 and chunks to 16k; a CPU a small grid."""
    mib = MIB_BYTES
    if device == "cuda":
        if quick:
            return SizePlan([256 * mib], [1, 8, 64, 512, 4096], [(8, 2048), (64, 8192)],
                            [2048, 8192], [1, 8, 64, 256], [512, 4096], [512, 4096], layers or 2)
        return SizePlan([64 * mib, 256 * mib, 1024 * mib],
                        [2**i for i in range(11)] + [2048, 4096, 8192, 16384],
                        [(b, c) for b in (1, 8, 32, 128) for c in (512, 2048, 8192, 32768)],
                        [512, 2048, 8192, 16384], [1, 2, 4, 8, 16, 32, 64, 128, 256],
                        [256, 1024, 4096], [256, 1024, 4096, 16384], layers or 4)
    if quick:
        return SizePlan([16 * mib, 64 * mib], [1, 16, 128], [(4, 512)], [256], [1, 4, 16, 32],
                        [256, 1024], [128, 512], layers or 1)
    return SizePlan([16 * mib, 64 * mib, 256 * mib], [1, 4, 16, 64, 256],
                    [(1, 1024), (8, 1024), (8, 4096)], [256, 1024], [1, 4, 16, 64],
                    [256, 2048], [64, 256, 1024], layers or 2)


@dataclass
class DeviceRun:
    device: str
    gpu: GpuSpec | None
    """Catalog GPU (cuda); the host spec is built after the run (cpu)."""
    measured: dict[str, Any]
    samples: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    interrupted: bool = False


def identify_cuda(b: bn.Bench, force: bool, catalog: Any) -> tuple[GpuSpec, dict[str, Any]]:
    """NVML identity of GPU 0, refused when busy, mapped to the catalog."""
    from capplan.probe.nvml import check_idle, query_gpu

    try:
        info = query_gpu(0)
    except ProbeUnavailable as e:
        if "not installed" not in str(e):
            raise
        name = b.torch.cuda.get_device_name(0)  # no NVML binding: torch still names it
        measured = {"device_name": name, "driver": "unknown (nvidia-ml-py not installed)"}
    else:
        check_idle(info, force, own_pid=os.getpid())
        name = info.name
        measured = {"device_name": name, "driver": info.driver, "nvml": info.as_dict()}
    try:
        gpu = catalog.gpu(name)
    except InputError as e:
        raise InputError(f"GPU {name!r} is not in the catalog: add a YAML with its datasheet "
                         "numbers under --catalog-dir DIR/gpus") from e
    return gpu, measured


def _steps(b: bn.Bench, model: ModelSpec, plan: SizePlan) -> list[tuple[str, Callable[[], None]]]:
    steps: list[tuple[str, Callable[[], None]]] = [
        ("copy bandwidth", lambda: bn.bench_copy(b, plan.copy_bytes)),
        ("matrix products", lambda: bn.bench_gemm(b, model, plan.gemm_tokens)),
        ("attention", lambda: bn.bench_attention(b, model, plan.attn_decode, plan.attn_prefill)),
    ]
    holder: dict[str, RandomDecoder] = {}

    def decoder() -> RandomDecoder:
        if "d" not in holder:
            holder["d"] = RandomDecoder(b, model, plan.layers)
        return holder["d"]

    kv_token_bytes = 2 * model.num_kv_heads * model.head_dim * 2 * plan.layers
    free = b.torch.cuda.mem_get_info()[0] if b.is_cuda else None
    for ctx in plan.decode_contexts:
        for batch in plan.decode_batches:
            if free is not None and batch * (ctx + 1) * kv_token_bytes > 0.5 * free:
                b.skipped.append(f"decode b{batch} c{ctx}: KV cache over half the free memory")
                continue
            for graphs in ([False, True] if b.is_cuda else [False]):
                steps.append((f"decode b{batch} c{ctx}{' graph' if graphs else ''}",
                              lambda batch=batch, ctx=ctx, graphs=graphs: b.guarded(
                                  f"decode b{batch} c{ctx}",
                                  lambda: decoder().time_decode(batch, ctx, graphs))))
    for chunk in plan.prefill_chunks:
        steps.append((f"prefill {chunk}", lambda chunk=chunk: b.guarded(
            f"prefill {chunk}", lambda: decoder().time_prefill(chunk))))
    return steps


def run_device(model: ModelSpec, device: str, quick: bool, layers: int | None, force: bool,
               catalog: Any, progress: bool = True) -> DeviceRun:
    """Measure everything in the plan; Ctrl-C keeps what was measured."""
    import sys

    import click

    check_supported(model)
    b = bn.open_bench(device, quick)
    plan = make_plan(device, quick, layers)
    if plan.layers > model.num_layers:
        raise InputError(f"--layers {plan.layers}: {model.key} has {model.num_layers} layers")
    gpu, measured = (identify_cuda(b, force, catalog) if b.is_cuda
                     else (None, {"device_name": f"host CPU ({_cpu_name()})", "driver": "n/a"}))
    measured.update({
        "torch": str(b.torch.__version__), "date": _dt.datetime.now(_dt.UTC).isoformat(
            timespec="seconds"), "model": model.key, "layers_measured": plan.layers,
        "method": "capplan calibrate: copy, GEMM, attention microbenchmarks and a random-weight "
                  f"decoder step ({plan.layers} layers scaled to {model.num_layers}), bf16, "
                  f"median of {b.repeats} after {b.warmup} warm-up; least-squares fit",
        "quick": quick})
    run = DeviceRun(device=device, gpu=gpu, measured=measured)
    steps = _steps(b, model, plan)
    try:
        with click.progressbar(steps, label="calibrating", file=sys.stderr,
                               item_show_func=lambda s: s[0] if s else "",
                               hidden=not progress) as bar:
            for _label, fn in bar:
                fn()
    except KeyboardInterrupt:
        run.interrupted = True
    run.samples, run.skipped = b.samples, b.skipped
    return run


def _cpu_name() -> str:
    import platform

    return platform.processor() or platform.machine()


def fit_run(run: DeviceRun, model: ModelSpec) -> tuple[GpuSpec, Calibration, FitResult | None]:
    """Fit the run's samples; without decoder samples only the microbenchmark fractions."""
    gpu = run.gpu if run.gpu is not None else host_gpu_spec(run.samples)
    base = default_calibration(gpu)
    priors = microbench_priors(run.samples, gpu)
    try:
        fit = fit_calibration(model, gpu, run.samples, base, priors)
    except ValueError:
        return gpu, base.with_(**priors, source="measured (microbenchmarks only)"), None
    return gpu, fit.calibration, fit


def param_sources(run: DeviceRun, params: dict[str, Any], fit: FitResult | None,
                  gpu: GpuSpec) -> dict[str, str]:
    """Where each parameter of the file comes from: fitted to the decoder steps, measured by a
    microbenchmark (on a CPU the copy and GEMM ones are 1 by construction: the host's peaks
    are this run's best rates), or the default (datasheet or engine profile). Without a fit
    (no decoder steps) the file holds the microbenchmark fractions: they are measured."""
    fitted = set(fit.fitted) if fit is not None else set()
    priors = fit.priors if fit is not None else microbench_priors(run.samples, gpu)
    host_peak = run.device == "cpu"
    out = {}
    for name, v in params.items():
        if v is None:
            continue
        if name in fitted:
            out[name] = sources.FITTED_STEPS
        elif name in priors and priors[name] == v:
            by_construction = host_peak and name in ("mem_bw_frac", "gemm_frac")
            out[name] = sources.BY_CONSTRUCTION if by_construction else sources.MICROBENCHMARK
        else:
            out[name] = sources.DEFAULT
    return out


def calibration_file(run: DeviceRun, gpu: GpuSpec, cal: Calibration, fit: FitResult | None
                     ) -> CalibrationFile:
    measured = dict(run.measured)
    if run.device == "cpu":
        measured["host_gpu_spec"] = host_device_record(gpu)
    measured["skipped"] = run.skipped
    measured["interrupted"] = run.interrupted
    params = {n: getattr(cal, n) for n in Calibration.param_names()}
    fit_d: dict[str, Any] = {"param_sources": param_sources(run, params, fit, gpu)}
    if fit is not None:
        fit_d = {**fit_d, **fit.after, "n_samples": fit.n_samples,
                 "before_median_rel_error": fit.before["median_rel_error"],
                 "before_worst_rel_error": fit.before["worst_rel_error"],
                 "microbenchmark_fractions": fit.priors,
                 **({"warnings": fit.warnings} if fit.warnings else {})}
    return CalibrationFile(gpu=gpu.key, kind="measured", measured=measured,
                           params=CalibrationParams(**params), fit=fit_d, samples=run.samples,
                           notes="step_overhead_s and per_seq_overhead_s measured here are "
                                 "kernel-launch costs only (no engine scheduler); `capplan "
                                 "calibrate --endpoint` measures a serving engine's.")
