"""Engine launch commands for a recommendation (every engine) and the benchmark that verifies
it: the lines are built by capplan.plan.launch (one builder per engine, the flag names and
their sources there), the verify command by capplan.plan.bench_cmds.

Every engine's memory fraction means something else (models/engine.py MemoryAccounting), so
each line's fraction is derived from the planned memory by that engine's own rule: the line
holds the KV cache the plan counted on, whichever engine it launches.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

from capplan.catalog.schema import ModelSpec
from capplan.models.engine import PROFILES
from capplan.models.layout import nodes_spanned
from capplan.models.memory import MemoryReport
from capplan.plan.bench_cmds import BenchImages, verify_lines
from capplan.plan.launch import BUILDERS, node_commands, options_from
from capplan.plan.placement import Output, PoolShape, fleet_address, fleet_text


def fleet_key(engine: str) -> str:
    """The key of an engine's fleet of several replicas in a recommendation's engine flags."""
    return f"fleet:{engine}"


def launch_text(flags: dict[str, str], engine: str) -> str:
    """What a report prints as an engine's launch: its fleet as it runs on hosts where the
    plan has several replicas (`fleet_key`), else its one replica's line ("" if none)."""
    return flags.get(fleet_key(engine)) or flags.get(engine) or ""


def replica_comment(i: int | str, hosts: str) -> str:
    """The shell comment an exported script puts over a replica's commands."""
    return f"# replica {i} on {hosts}"


_REPLICA_LABEL = re.compile(r"^replica (\d+) \((.+?)\): (.*)$")
_NODE_LABEL = re.compile(r"^node (\d+): (.*)$")
_PART_LABEL = re.compile(r"^(router|hosts): (.*)$")


def runnable(text: str) -> str:
    """A launch block as the exports give it to copy and run (the one formatter of the
    Markdown ```bash blocks, the HTML copy buttons and the CSV pools): the terminal's labels
    become shell comments over the commands they name ("replica 0 (localhost): CMD" ->
    "# replica 0 on localhost" then CMD; "node 1: CMD" -> "# node 1" then CMD; "router: CMD"
    -> "# router" then CMD; "hosts: ..." -> "# hosts: ..."), continuation lines unindented."""
    out: list[str] = []
    for line in str(text).split("\n"):
        body = line.strip()
        if m := _REPLICA_LABEL.match(body):
            out.append(replica_comment(m[1], m[2]))
            body = m[3]
        if m := _NODE_LABEL.match(body):
            out.append(f"# node {m[1]}")
            body = m[2]
        if m := _PART_LABEL.match(body):
            if m[1] == "hosts":
                out.append(f"# {body}")
                continue
            out.append(f"# {m[1]}")
            body = m[2]
        out.append(body)
    return "\n".join(out)


def memory_fractions(mem: MemoryReport) -> dict[str, float]:
    """Each engine's memory fraction that yields the plan's KV cache (rounded up to 0.001), by
    the rule its profile's flag follows (MemoryAccounting.fraction_for).

    vLLM: (weights + activation peak + non-torch + KV) / total; SGLang --mem-fraction-static:
    (weights + non-torch + KV) / (total - context), activations outside; TensorRT-LLM
    free_gpu_memory_fraction: KV / (memory free after the context, weights, activations,
    runtime and graphs) (capplan.models.engine.MemoryAccounting).
    """
    overheads = (mem.runtime_overhead_bytes_per_gpu, mem.cuda_graph_bytes_per_gpu,
                 mem.context_bytes_per_gpu)

    def up(x: float) -> float:
        return min(math.ceil(x * 1000 - 1e-6) / 1000, 1.0)

    return {name: up(prof.memory.fraction_for(
                mem.total_memory_bytes, mem.kv_cache_bytes_per_gpu, mem.weights_bytes_per_gpu,
                mem.activation_peak_bytes_per_gpu, overheads))
            for name, prof in PROFILES.items()}


def engine_flags(model: ModelSpec, r: dict[str, Any], traffic: Any,
                 memory: MemoryReport | None = None, client: str | None = None,
                 gpus_per_node: int = 8, out: Output | None = None) -> dict[str, str]:
    """Launch lines for every engine (capplan.plan.launch, one builder per engine) and the
    verify command for the planned engine (capplan.plan.bench_cmds); `memory` (the planned
    MemoryReport) sets each engine's memory fraction by its own rule, else the planned
    engine's fraction is printed as is. Files a line reads are under "files:<engine>". A
    replica wider than a node (`gpus_per_node`, the GPU's NVLink domain) gets one command per
    node, one per text line (capplan.plan.launch.node_commands). The engine's key holds one
    replica's line (the Kubernetes export's, whose device plugin assigns GPUs); a fleet of
    several replicas is also under "fleet:<engine>" as it runs on hosts
    (capplan.plan.placement.fleet_text: each replica pinned to its GPUs on its port, the
    router in front, where each runs), and its verify line sends to its first replica, on its
    host. `out`: the fleets its output prints beside it, placed as one (`place_together`)."""
    frac = memory_fractions(memory) if memory is not None else {
        e: r["gpu_memory_utilization"] for e in PROFILES}
    own_format = model.quantization.format if model.quantization else model.torch_dtype
    world = r["tp"] * r.get("pp", 1) * r.get("attention_dp", 1)
    opts = options_from(r, model.hf_id, own_format, frac,
                        priority_scheduling=bool(getattr(traffic, "priority_scheduling", False)),
                        nodes=nodes_spanned(world, gpus_per_node), gpus_per_node=gpus_per_node)
    replicas = int(r.get("replicas") or 1)
    flags: dict[str, str] = {}
    for engine, build in BUILDERS.items():
        line = build(opts)
        flags[engine] = "\n".join(node_commands(line, opts))
        if replicas > 1 or out is not None:  # as it runs: each replica placed, a router
            flags[fleet_key(engine)] = fleet_text(engine, opts, replicas, out)
        for name, text in line.files.items():
            flags[f"file:{engine}:{name}"] = text
    engine = r.get("engine", "vllm")
    at = fleet_address(engine, opts, replicas, out)  # one replica's, at its share of the rate
    return {**flags, **verify_lines(model.hf_id, r["per_replica_rate_per_s"], engine, at,
                                  traffic, client, images=bench_images(model, r, traffic))}


def bench_images(model: ModelSpec, r: dict[str, Any], traffic: Any) -> BenchImages | None:
    """The images of a recommendation's requests for a synthetic image benchmark (None: none):
    the largest lane's count and size (r's images_per_request, image_width, image_height), the
    text tokens the pooled prompt mean holds beside their tokens, the mean output."""
    n = int(r.get("images_per_request") or 0)
    if not n or model.vision is None:
        return None
    from capplan.models.vision import image_tokens

    w, h = int(r["image_width"]), int(r["image_height"])
    inp = getattr(getattr(traffic, "inp", None), "mean", 0.0)
    out = getattr(getattr(traffic, "out", None), "mean", 1.0)
    text = round(float(inp)) - n * image_tokens(h, w, model.vision)
    return BenchImages(count=n, width=w, height=h, text_tokens=max(1, text),
                       output_tokens=max(1, round(float(out))))


def fleet_pool(rec: Any) -> PoolShape:
    """A recommendation's fleet as `place` takes it."""
    s, gpu = rec.candidate.settings, rec.candidate.gpu
    return PoolShape("replica", rec.replicas, s.tp * s.pp * s.attention_dp, gpu.host_gpus,
                     gpu.key)


def place_together(recs: Sequence[Any]) -> list[Any]:
    """Recommendations one output prints side by side (they run at once: several models' day
    plans, a plan's pool per lane) with their launch lines placed as one: hosts, GPUs, the
    replicas' ports and the routers' ports continue from one fleet to the next
    (capplan.plan.placement.Output). One recommendation keeps its own lines; one without
    `relaunch` (its engine_flags' inputs) is left as it is."""
    if len(recs) < 2 or any(r.relaunch is None for r in recs):
        return list(recs)
    pools = tuple(fleet_pool(r) for r in recs)
    return [r.with_(engine_flags=r.relaunch(out=Output(pools, i))) for i, r in enumerate(recs)]
