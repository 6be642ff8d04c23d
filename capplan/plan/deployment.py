"""One deployment: a model on a GPU type with engine settings, its memory plan and step model.

The single place the CLI's names and options become specs, settings and models.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from capplan.catalog.calibration import find_default_calibration, load_calibration
from capplan.catalog.loader import Catalog
from capplan.catalog.schema import GpuSpec, ModelSpec
from capplan.models.calibration import Calibration
from capplan.models.engine import EngineSettings
from capplan.models.memory import MemoryReport, memory_report
from capplan.models.perf import StepModel, build_step_model


@dataclass(frozen=True)
class Deployment:
    model: ModelSpec
    gpu: GpuSpec
    settings: EngineSettings
    calibration: Calibration
    memory: MemoryReport
    step: StepModel

    @property
    def gpus_per_replica(self) -> int:
        return self.settings.tp * self.settings.pp


def calibration_for(cat: Catalog, gpu: GpuSpec, path: str | Path | None) -> Calibration:
    if path:
        return load_calibration(path, gpu)
    return find_default_calibration(gpu, cat.calibration_dirs)


def build_deployment(model: ModelSpec, gpu: GpuSpec, settings: EngineSettings,
                     calibration: Calibration) -> Deployment:
    mem = memory_report(model, gpu, settings)
    step = build_step_model(model, gpu, settings, calibration)
    return Deployment(model, gpu, settings, calibration, mem, step)


def resolve_deployment(cat: Catalog, model_name: str, gpu_name: str, settings: EngineSettings,
                       calibration_path: str | Path | None = None) -> Deployment:
    """Names -> Deployment; a weight-dtype suffix in the model name applies when dtype is auto."""
    resolved = cat.resolve_model(model_name)
    if settings.weight_dtype == "auto" and resolved.implied_weight_dtype:
        settings = settings.with_(weight_dtype=resolved.implied_weight_dtype)
    gpu = cat.gpu(gpu_name)
    return build_deployment(resolved.spec, gpu, settings, calibration_for(cat, gpu,
                                                                           calibration_path))
