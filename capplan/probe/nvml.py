"""Identify the GPU through NVML (nvidia-ml-py, imported lazily) and check that it is idle.

NVML reports the marketing name (``NVIDIA H100 80GB HBM3``), total memory in bytes, clocks in
MHz, the driver version and the compute processes running on the device. Source: NVML API
reference, nvmlDeviceGetName / GetMemoryInfo / GetClockInfo / GetMaxClockInfo /
GetComputeRunningProcesses (docs.nvidia.com/deploy/nvml-api).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from capplan.errors import ProbeUnavailable

INSTALL_HINT = "run `pip install capplan[gpu]`"


@dataclass(frozen=True)
class GpuInfo:
    """What NVML says about one device."""

    index: int
    name: str
    memory_total_bytes: int
    memory_used_bytes: int
    driver: str
    sm_clock_mhz: int | None
    max_sm_clock_mhz: int | None
    mem_clock_mhz: int | None
    num_processes: int
    process_pids: tuple[int, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {
            "index": self.index, "name": self.name, "memory_total_bytes": self.memory_total_bytes,
            "memory_used_bytes": self.memory_used_bytes, "driver": self.driver,
            "sm_clock_mhz": self.sm_clock_mhz, "max_sm_clock_mhz": self.max_sm_clock_mhz,
            "mem_clock_mhz": self.mem_clock_mhz, "num_processes": self.num_processes,
        }


def _import_pynvml() -> Any:
    try:
        import pynvml  # nvidia-ml-py provides this module
    except ImportError as e:
        raise ProbeUnavailable(f"pynvml is not installed: {INSTALL_HINT}") from e
    return pynvml


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _maybe(fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except Exception:  # noqa: BLE001 - optional NVML queries fail on some boards/drivers
        return None


def query_gpu(index: int = 0, pynvml: Any = None) -> GpuInfo:
    """Name, memory, clocks, driver and running processes of GPU `index`.

    Args:
        index: CUDA/NVML device index.
        pynvml: the module to use (tests pass a fake); default imports nvidia-ml-py.

    Raises:
        ProbeUnavailable: pynvml missing, NVML failing to initialise, or no such GPU.
    """
    nv = pynvml or _import_pynvml()
    try:
        nv.nvmlInit()
    except Exception as e:  # noqa: BLE001 - NVMLError_LibraryNotFound, DriverNotLoaded...
        raise ProbeUnavailable(f"NVML could not start ({e}): no NVIDIA GPU or driver found") from e
    try:
        count = nv.nvmlDeviceGetCount()
        if index >= count:
            raise ProbeUnavailable(f"GPU index {index} not found: NVML sees {count} GPU(s)")
        h = nv.nvmlDeviceGetHandleByIndex(index)
        mem = nv.nvmlDeviceGetMemoryInfo(h)
        procs = _maybe(nv.nvmlDeviceGetComputeRunningProcesses, h) or []
        return GpuInfo(
            index=index,
            name=_text(nv.nvmlDeviceGetName(h)),
            memory_total_bytes=int(mem.total),
            memory_used_bytes=int(mem.used),
            driver=_text(_maybe(nv.nvmlSystemGetDriverVersion) or "unknown"),
            sm_clock_mhz=_maybe(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_SM),
            max_sm_clock_mhz=_maybe(nv.nvmlDeviceGetMaxClockInfo, h, nv.NVML_CLOCK_SM),
            mem_clock_mhz=_maybe(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_MEM),
            num_processes=len(procs),
            process_pids=tuple(int(getattr(p, "pid", 0)) for p in procs),
        )
    finally:
        _maybe(nv.nvmlShutdown)


def check_idle(info: GpuInfo, force: bool, own_pid: int | None = None) -> None:
    """Refuse a GPU other processes are using: they would skew every timing.

    Raises:
        ProbeUnavailable: another process runs on the GPU and `force` is False.
    """
    others = [p for p in info.process_pids if p != own_pid] if info.process_pids else []
    busy = len(others) if info.process_pids else info.num_processes
    if busy and not force:
        raise ProbeUnavailable(
            f"GPU {info.index} ({info.name}) is busy: {busy} other process(es) use it; "
            "stop them or pass --force")
