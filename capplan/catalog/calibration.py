"""Calibration files: YAML <-> models.calibration.Calibration, and the default lookup.

A calibration file (written by `capplan calibrate`, or by hand):

    gpu: h100-sxm                 # catalog key of the GPU it was measured on
    kind: measured                # measured | default
    measured: {device_name: ..., driver: ..., torch: ..., date: ..., method: ...}
    params: {mem_bw_frac: 0.87, gemm_frac: 0.8, ...}   # every Calibration field
    fit: {median_rel_error: 0.03, worst_rel_error: 0.09, n_samples: 120}
    samples: [...]                # raw measurements (free form)
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from capplan.catalog.host import host_device_from_record
from capplan.catalog.loader import names_entry, read_yaml
from capplan.catalog.schema import GpuSpec
from capplan.errors import InputError, validation_error_line
from capplan.models.calibration import Calibration, default_calibration

_FRACTIONS = ("mem_bw_frac", "gemm_frac", "gemm_frac_low_precision", "attn_frac",
              "attn_bw_frac", "allreduce_bw_frac")


# Upper bounds of the measured overheads: an engine step of H100-class serving takes 5-50 ms,
# the slowest published per-step overhead (CPU scheduling, vLLM V0) ~10 ms, so 1 s per step (or
# per sequence, layer, all-reduce) is no GPU's; a request's client-side overhead (HTTP,
# tokenisation) is milliseconds, 60 s is a timeout. Past them the step time overflowed float64
# (step_overhead_s: 1e308 gave an IndexError; request_overhead_s: 1e308 a TTFT of inf).
STEP_S = 1.0
REQUEST_S = 60.0
_TOKENS = 2**24  # limits.TOKENS
_MIN_FRAC = 1e-3
"""Smallest efficiency fraction: published MBU/MFU of serving engines are 0.3-0.9; a GPU at 0.1%
of its datasheet is a mis-measurement, and at 1e-183 the step times overflowed (internal error)."""


class CalibrationParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    mem_bw_frac: float | None = Field(default=None, ge=_MIN_FRAC, le=1)
    gemm_frac: float | None = Field(default=None, ge=_MIN_FRAC, le=1)
    gemm_frac_low_precision: float | None = Field(default=None, ge=_MIN_FRAC, le=1)
    gemm_half_tokens: float | None = Field(default=None, ge=0, le=_TOKENS)
    attn_frac: float | None = Field(default=None, ge=_MIN_FRAC, le=1)
    attn_bw_frac: float | None = Field(default=None, ge=_MIN_FRAC, le=1)
    expert_bw_frac: float | None = Field(default=None, ge=0, le=1)
    expert_gemm_frac: float | None = Field(default=None, ge=_MIN_FRAC, le=1)
    per_moe_layer_overhead_s: float | None = Field(default=None, ge=0, le=STEP_S)
    step_overhead_s: float | None = Field(default=None, ge=0, le=STEP_S)
    per_seq_overhead_s: float | None = Field(default=None, ge=0, le=STEP_S)
    per_layer_overhead_s: float | None = Field(default=None, ge=0, le=STEP_S)
    allreduce_latency_s: float | None = Field(default=None, ge=0, le=STEP_S)
    allreduce_bw_frac: float | None = Field(default=None, ge=_MIN_FRAC, le=1)
    request_overhead_s: float | None = Field(default=None, ge=0, le=REQUEST_S)
    spec_acceptance_length: float | None = Field(default=None, ge=1, le=65)


class CalibrationFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    version: int = 1
    gpu: str
    kind: Literal["measured", "default"] = "measured"
    measured: dict[str, Any] = {}
    params: CalibrationParams
    fit: dict[str, Any] = {}
    samples: list[Any] = []
    notes: str | None = None


def read_calibration_file(path: Path) -> CalibrationFile:
    data = read_yaml(Path(path))
    if not isinstance(data, dict):
        raise InputError(f"{path}: a calibration file is a YAML mapping")
    _check_version(path, data)
    params = data.get("params")
    if isinstance(params, dict):
        for k, v in params.items():
            if isinstance(v, float) and not math.isfinite(v):
                raise InputError(f"{path}: params.{k} is not a finite number")
    try:
        return CalibrationFile.model_validate(data)
    except ValidationError as e:
        keys = [*CalibrationFile.model_fields, *CalibrationParams.model_fields]
        raise InputError(f"{path}: {validation_error_line(e, keys)[1]}") from e


SERVING_METHOD = "serving benchmark levels"
"""measured.method of a calibration fitted from serving levels (probe/results.py)."""


def calibration_from_file(cf: CalibrationFile, gpu: GpuSpec, source: str) -> Calibration:
    """Measured parameters over the GPU's datasheet defaults (missing ones keep defaults)."""
    base = default_calibration(gpu)
    given = {k: v for k, v in cf.params.model_dump().items() if v is not None}
    engine = cf.measured.get("engine")
    # a serving calibration's host costs and request overhead were measured with one model
    model = cf.measured.get("model") if cf.measured.get("method") == SERVING_METHOD else None
    return base.with_(**given, source=source,  # type: ignore[arg-type]
                      engine=str(engine) if engine else None,
                      model=str(model) if model else None)


def _check_version(path: Path, data: dict[str, Any]) -> None:
    """Version 1 is the only calibration format; a later one may mean other things by the
    same keys, so it is refused rather than read as 1."""
    v = data.get("version", 1)
    if isinstance(v, bool) or v != 1:
        raise InputError(f"{path}: calibration file version {str(v)[:20]!r} is not one this "
                         "capplan reads (version 1); upgrade capplan or re-run `capplan "
                         "calibrate`")


def calibration_gpu(path: str | Path) -> str:
    """The catalog key of the device a calibration file was measured on."""
    return read_calibration_file(Path(path)).gpu


def calibration_device(path: str | Path) -> GpuSpec | None:
    """The host device a CPU calibration file was measured on (`capplan calibrate --device
    cpu` embeds its measured peaks), or None for a file measured on a catalog GPU."""
    cf = read_calibration_file(Path(path))
    spec = host_device_from_record(cf.measured.get("host_gpu_spec"))
    return spec if spec is not None and spec.key == cf.gpu else None


def load_calibration(path: str | Path, gpu: GpuSpec) -> Calibration:
    """A calibration file for this GPU. A file measured on another device is refused: its
    efficiencies and overheads belong to that device (a CPU run applied to an H100 predicts
    a thirtieth of its speed)."""
    cf = read_calibration_file(Path(path))
    if not names_entry(cf.gpu, gpu):
        raise InputError(f"{path}: measured on {cf.gpu}, not {gpu.key}; a calibration applies "
                         f"only to its own device (run `capplan calibrate` on a {gpu.key}, or "
                         "leave --calibration out)")
    return calibration_from_file(cf, gpu, f"{cf.kind} ({path})")


def find_default_calibration(gpu: GpuSpec, dirs: list[Path]) -> Calibration:
    """A measured calibration file for this GPU in the calibration dirs, else the default."""
    for d in dirs:
        if not d.is_dir():
            continue
        for path in sorted(d.glob("*.yaml")):
            cf = read_calibration_file(path)
            if names_entry(cf.gpu, gpu) and cf.kind == "measured":
                return calibration_from_file(cf, gpu, f"measured ({path.name})")
    return default_calibration(gpu)


def write_calibration(path: Path, cf: CalibrationFile) -> None:
    import yaml

    from capplan.export.atomic import atomic_write_text

    atomic_write_text(Path(path), yaml.safe_dump(cf.model_dump(mode="json"), sort_keys=False))
