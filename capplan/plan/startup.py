"""How long a new replica takes to serve: weights loaded from storage, then engine start-up.

    replica_start_s = weights_bytes_per_replica / load_bytes_per_s + engine_startup_s

The weights of a replica (every GPU's shard) come from one node's storage; the load rate is
the storage's (a stated figure, or the user's `load_gb_per_s`). Engine start-up is the
measured rest: CUDA context, torch.compile (from its cache), memory profiling, KV-cache
allocation and CUDA-graph capture. Pod scheduling and container image pulls are not counted
(they depend on the cluster; add them to `engine_startup_s`).
"""

from __future__ import annotations

from dataclasses import dataclass

from capplan.errors import InputError
from capplan.units import GB_BYTES

LOAD_GB_PER_S = {
    "nvme": 6.9,
    "network": 1.25,
}
"""Storage read rates (GB/s) a replica loads its weights at.
source nvme: Samsung PM9A3 U.2 data-center NVMe datasheet, 6,900 MB/s sequential read
(a PCIe 4.0 x4 drive, the class cloud GPU nodes carry locally).
source network: a 10 Gb/s link's line rate (10 / 8 = 1.25 GB/s), the common pod network;
llm-d measured pod cold starts of 110 s from network storage and 52 s with the weights on a
host path (llm-d/llm-d-autoscaling issue 1433), the difference being the load."""

ENGINE_STARTUP_S = 60.0
"""Engine start-up after the weights are in, seconds.
source: vLLM issue 20264 (Llama 3.2 on one GPU, torch.compile cache reused): engine init
(profile, KV cache, warm-up) 34 s, of which CUDA-graph capture 17 s, first response after
59 s in total. Without a compile cache vLLM issue 19824 measured Llama-70B-FP8 TP 8 at ~15 s
Dynamo + ~70 s torch.compile + ~60 s graph capture (set engine_startup_s to ~150 then)."""


@dataclass(frozen=True, kw_only=True)
class StartupLag:
    """The time from the decision to add a replica to its first served request."""

    weights_bytes: float
    """Weights of one replica, all its GPUs (bytes)."""
    load_from: str
    load_bytes_per_s: float
    engine_startup_s: float

    @property
    def load_s(self) -> float:
        return self.weights_bytes / self.load_bytes_per_s

    @property
    def total_s(self) -> float:
        return self.load_s + self.engine_startup_s

    def to_dict(self) -> dict[str, float | str]:
        return {"weights_bytes": self.weights_bytes, "load_from": self.load_from,
                "load_bytes_per_s": self.load_bytes_per_s, "load_s": self.load_s,
                "engine_startup_s": self.engine_startup_s, "replica_start_s": self.total_s}


def startup_lag(weights_bytes: float, load_from: str = "nvme",
                load_gb_per_s: float | None = None,
                engine_startup_s: float = ENGINE_STARTUP_S) -> StartupLag:
    """The lag of one replica whose weights weigh `weights_bytes` (see the module docstring)."""
    if load_gb_per_s is None:
        if load_from not in LOAD_GB_PER_S:
            raise InputError(f"load_from {load_from!r}: use {' or '.join(LOAD_GB_PER_S)}, or "
                             "give load_gb_per_s")
        load_gb_per_s = LOAD_GB_PER_S[load_from]
    if not load_gb_per_s > 0 or load_gb_per_s > 1000:
        raise InputError(f"load_gb_per_s {load_gb_per_s}: must be > 0 and <= 1000")
    if not 0 <= engine_startup_s <= 86_400:
        raise InputError(f"engine_startup_s {engine_startup_s}: must be >= 0 and <= 86400")
    return StartupLag(weights_bytes=float(weights_bytes),
                      load_from=load_from if load_gb_per_s == LOAD_GB_PER_S.get(load_from)
                      else "given", load_bytes_per_s=load_gb_per_s * GB_BYTES,
                      engine_startup_s=float(engine_startup_s))
