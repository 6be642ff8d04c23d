"""capplan: capacity planning for LLM serving (vLLM, SGLang, TensorRT-LLM).

The public API (docs/api.md) is imported lazily, so `import capplan` and `capplan --help` stay
fast:

    import capplan
    capplan.memory("llama-3.1-8b", "h100-sxm").kv_cache_tokens
    capplan.latency("llama-3.1-8b", "h100-sxm", rate=10, input_len=1024, output_len=256)
    capplan.recommend("llama-3.1-8b", rate=20, input_len=1024, output_len=256, ttft_p99_s=1)
"""

from __future__ import annotations

from typing import Any

__all__ = ["deployment", "latency", "memory", "recommend", "run_plan", "simulate", "speed",
           "verify"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from capplan import api

        return getattr(api, name)
    raise AttributeError(f"module 'capplan' has no attribute {name!r}")
