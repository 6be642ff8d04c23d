"""The host CPU as a device: the spec a `capplan calibrate --device cpu` run measured.

A CPU calibration file embeds the host's measured peaks under `measured.host_gpu_spec`; with
that file, `--gpu <its key>` (e.g. `cpu-x86_64-2c`) names a device every command accepts, so a
CPU calibration predicts the host it was measured on (docs/probe.md). It is never a catalog
entry: the peaks are the best rates one run measured, labelled as such.
"""

from __future__ import annotations

from typing import Any

from capplan.catalog.schema import GpuSpec, Interconnect
from capplan.units import TERA

HOST_SOURCE = "estimated by a quick measurement: the best copy/GEMM rates of this run"


def host_device(key: str, name: str, memory_mib: float, bandwidth_gb_per_s: float,
                bf16_tflops: float) -> GpuSpec:
    """A GpuSpec for a host CPU (vendor 'cpu' is outside the catalog's, so not validated)."""
    src = "estimated by a quick measurement (capplan calibrate --device cpu)"
    return GpuSpec.model_construct(
        key=key, name=name, vendor="cpu", aliases=[], nvml_names=[], memory_mib=memory_mib,
        cuda_total_memory_gib=None, memory_bandwidth_gb_per_s=bandwidth_gb_per_s,
        bf16_dense_tflops=bf16_tflops, fp16_dense_tflops=None, fp8_dense_tflops=None,
        int8_dense_tops=None, fp4_dense_tflops=None,
        interconnect=Interconnect(kind="pcie4", bandwidth_gb_per_s=bandwidth_gb_per_s,
                                  max_gpus_per_node=1),
        price_per_hour_usd=None,
        source={"memory_bandwidth_gb_per_s": src, "bf16_dense_tflops": src,
                "memory_mib": "os.sysconf"},
        notes="Host CPU measured by capplan calibrate; peaks are the best measured rates.")


def host_device_record(spec: GpuSpec) -> dict[str, Any]:
    """What a calibration file embeds to rebuild the device (`host_device_from_record`)."""
    return {"key": spec.key, "name": spec.name, "memory_mib": spec.memory_mib,
            "memory_bandwidth_gb_per_s": spec.memory_bandwidth_gb_per_s,
            "bf16_dense_tflops": spec.bf16_dense_tflops, "source": HOST_SOURCE}


def host_device_from_record(rec: Any) -> GpuSpec | None:
    """The device a calibration file's `measured.host_gpu_spec` describes, or None."""
    if not isinstance(rec, dict):
        return None
    try:
        vals = [float(rec[k]) for k in
                ("memory_mib", "memory_bandwidth_gb_per_s", "bf16_dense_tflops")]
        key, name = str(rec["key"]), str(rec.get("name", rec["key"]))
    except (KeyError, TypeError, ValueError):
        return None
    if not all(0 < v < TERA for v in vals):  # a sanity bound on each field
        return None
    return host_device(key, name, *vals)
