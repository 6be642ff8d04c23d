"""Engine launch lines built from a plan: one builder per engine, all options in one dataclass.

Flag names are each engine's own (tests/plan/engine_args.py holds the argument sets with their
sources and parses every line against them):
- vLLM `vllm serve` (vllm/engine/arg_utils.py EngineArgs, 0.10-0.11; `--host`/`--port` from
  vllm/entrypoints/openai/cli_args.py, default port 8000);
- SGLang `python -m sglang.launch_server` (python/sglang/srt/server_args.py ServerArgs, 0.5;
  default host 127.0.0.1, port 30000);
- TensorRT-LLM `trtllm-serve` (tensorrt_llm/commands/serve.py, 1.x; default host localhost,
  port 8000; every other LLM-API setting through one `--extra_llm_api_options` YAML file).
All three answer `GET /health` (vLLM api_server, SGLang http_server, trtllm-serve docs
"commands/trtllm-serve"), which the Kubernetes probes use.

To add an engine feature (speculative decoding, LoRA), add a field to LaunchOptions and a line
in each builder. A replica over several hosts gets one command per host from `node_commands`.
"""

from __future__ import annotations

import math
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from capplan.errors import InputError
from capplan.models.engine import ENGINES, engine_display_name, engine_profile, launch_limit
from capplan.models.layout import deepep_mode, engine_world
from capplan.plan.feature_flags import feature_launch

DISAGG_PORTS = {"prefill": 8100, "decode": 8200}
"""The HTTP port of a disaggregated pool's first worker on a host (vLLM's disaggregated-serving
examples use 8100 and 8200); the pool's next worker on that host takes the next free port
(capplan.plan.placement.host_ports). Every P/D launch line (`recommend`'s pools, a fixed
layout's workers), hosts line, router line and Kubernetes manifest takes its workers' ports
from here, and its front end's from `pd_front_port`."""
REPLICA_PORT = 8100
"""The HTTP port of an aggregated fleet's first replica on a host when the fleet runs several
replicas behind a router (capplan.plan.placement.fleet_text), the next replica on that host on
the next free port; the router listens on `pd_front_port`. A fleet of one replica listens on
the engine's default port (`default_port`) itself."""


def pd_front_port(engine: str) -> int:
    """The port of the router or proxy in front of a disaggregated layout or of an aggregated
    fleet's replicas: the engine's default (`default_port`), where its own clients and the
    layout's verify line look."""
    return default_port(engine)


def default_port(engine: str) -> int:
    """The engine's default HTTP port (EngineProfile.default_port)."""
    return engine_profile(engine).default_port

HEALTH_PATH = "/health"
TRTLLM_OPTIONS_FILE = "llm_api_options.yaml"
"""The TensorRT-LLM LLM-API options file a line reads (its content is in LaunchLine.files)."""
TRTLLM_ROLE_FILES = {"prefill": "ctx_extra-llm-api-config.yaml",
                     "decode": "gen_extra-llm-api-config.yaml"}
"""A disaggregated context / generation server's options file (the names of TensorRT-LLM's
examples/disaggregated/README.md), so both pools' files can sit in one directory."""
_VLLM_QUANT = {"fp8": "fp8"}  # int4/fp4 need a pre-quantized checkpoint (AWQ/GPTQ/NVFP4 repo)



def pool_command(text: str) -> str:
    """A disaggregated pool's launch text (`disaggregated.launch`, "N x: " then its first
    replica's command, one line per host) as it runs: without the replica count."""
    return re.sub(r"^\d+ x: ", "", text)


def sized_for(best: dict[str, Any]) -> str:
    """Which line the figures are for: the plan sized one engine (--engine); the others carry
    its settings in their own flags, their figures not predicted."""
    engine = best.get("engine", "")
    spec = best.get("engine_profile") or engine
    label = engine_label(engine, spec)
    keys = [k for k in ENGINES if k != engine and k in best["engine_flags"]]
    others = [engine_display_name(k) for k in keys]
    many = len(others) > 1
    differ = _budgets_launched(best, keys)
    same = ("the same settings" if not differ else
            f"the same settings but {', '.join(differ)}")
    rest = (f"; the {' and '.join(others)} line{'s carry' if many else ' carries'} {same}, "
            f"not sized for {'those engines' if many else 'that engine'}"
            if others else "")
    return f"sized for: {label}{rest}"


def _budgets_launched(best: dict[str, Any], keys: list[str]) -> list[str]:
    """The other engines' lines whose token budget is not the plan's: a whole-prompt engine
    launches at least max-model-len (SchedulerPolicy.launched_budget), e.g. TensorRT-LLM's
    "--max_num_tokens 4096 (at least max-model-len 4096; the plan's budget is 512)"."""
    budget, max_len = best.get("max_num_batched_tokens"), best.get("max_model_len")
    if not budget or not max_len:
        return []
    out = []
    for k in keys:
        prof = engine_profile(k)
        run = prof.scheduler.launched_budget(int(budget), int(max_len))
        if run != int(budget):
            flag = prof.flag_names.get("max_num_batched_tokens", "max_num_batched_tokens")
            out.append(f"{prof.display_name}'s {flag} {run} (whole prompts: at least "
                       f"max-model-len {max_len}; the plan's budget is {budget})")
    return out


def engine_label(engine: str, spec: str | None = None) -> str:
    """An engine's display name (EngineProfile.display_name), with the profile a plan was
    sized for after it when that is not the bare engine: "TensorRT-LLM (trtllm 1.2
    +no-overlap)"."""
    spec = spec or engine
    try:  # a pinned name (vllm@0.19) of the engine's default profile is the bare engine
        spec = engine_profile(spec).spec
    except InputError:
        pass
    return engine_display_name(engine) + (f" ({spec})" if spec != engine else "")


def _plain(rec: dict[str, Any]) -> bool:
    return all((rec.get(k) or 1) == 1 for k in ("pp", "attention_dp", "expert_parallel"))


def layout_of(rec: dict[str, Any]) -> str:
    """A recommendation's layout in a sentence: "TP 4", or its GPUs and parallelism where it
    has more than TP ("(16 GPUs over 2 nodes: attention TP 1 x DP 16, EP 16)"), so that
    replicas x layout reads as its GPUs."""
    return f"TP {rec['tp']}" if _plain(rec) or not rec.get("layout") else f"({rec['layout']})"


def fleet_words(rec: dict[str, Any], extra: str = "") -> str:
    """"3 x h200 TP 8 (24 GPUs)": replicas, GPU, layout and the GPUs in all; one replica whose
    layout already counts its GPUs ("(16 GPUs over 2 nodes: ...)") does not count them twice.
    `extra` (", $96.00/h") goes in the count's parentheses."""
    n = rec.get("gpus_total")
    count = f"{n} GPU{'' if n == 1 else 's'}"
    if not _plain(rec) and rec.get("layout") and rec.get("replicas") == 1:
        count = ""
    inside = (count + extra).removeprefix(", ")
    return (f"{rec.get('replicas')} x {rec.get('gpu')} {layout_of(rec)}"
            + (f" ({inside})" if inside else ""))


def layout_cell(rec: dict[str, Any]) -> str:
    """The same in a table cell: "4", "1xDP16 EP16", "8 PP2"."""
    if _plain(rec):
        return str(rec["tp"])
    dp, pp, ep = (rec.get(k) or 1 for k in ("attention_dp", "pp", "expert_parallel"))
    return (f"{rec['tp']}" + (f"xDP{dp}" if dp > 1 else "") + (f" PP{pp}" if pp > 1 else "")
            + (f" EP{ep}" if ep > 1 else ""))


@dataclass(frozen=True, kw_only=True)
class LaunchOptions:
    """Everything a launch line says, as the plan decided it (one replica of one pool)."""

    model_id: str
    """The served checkpoint (Hugging Face id or path)."""
    tp: int
    pp: int = 1
    attention_dp: int = 1
    expert_parallel: int = 1
    max_num_seqs: int
    max_num_batched_tokens: int
    memory_fraction: dict[str, float]
    """Each engine's memory fraction in its own meaning (plan.flags.memory_fractions)."""
    max_model_len: int
    weight_dtype: str = "auto"
    checkpoint_format: str = "bf16"
    """The checkpoint's own weight format (fp8 checkpoints are served as they ship)."""
    kv_dtype: str = "auto"
    host: str = "0.0.0.0"
    port: int | None = None
    """None: the engine's default port (`default_port`)."""
    role: str | None = None
    """None (aggregated), "prefill" or "decode" (disaggregated pools)."""
    kv_handshake: tuple[str | None, int] | None = None
    """(host, port) of the KV handshake a disaggregated worker listens on (PdServing.kv_handshake):
    vLLM's NIXL side channel (VLLM_NIXL_SIDE_CHANNEL_HOST / _PORT; no host: localhost, its
    default), SGLang's prefill bootstrap server (--disaggregation-bootstrap-port); None: the
    engine's default port, for the one worker of a host."""
    host_overlap: bool = True
    """Whether the engine runs its host overlap (EngineProfile.host_overlap); TensorRT-LLM's
    line says when it is off (disable_overlap_scheduler), as its context servers run."""
    gpu_ids: tuple[int, ...] = ()
    """GPUs of this replica on its node (CUDA_VISIBLE_DEVICES); empty: all the node shows."""
    priority_scheduling: bool = False
    extra: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """Further words per engine (e.g. {"vllm": ("--enable-lora",)}), appended as given."""
    llm_api_options: tuple[str, ...] = ()
    """Further TensorRT-LLM LLM-API YAML lines (speculative_config, lora_config)."""
    nodes: int = 1
    """Hosts one replica spans; > 1: one command per host (`node_commands`)."""
    gpus_per_node: int = 8
    """GPUs per host (the GPU catalog's `host_gpus`)."""
    deepep: dict[str, str] = field(default_factory=dict)
    """Each engine's words that run the DeepEP mode its step model costs (`deepep_launch`);
    an engine absent runs none."""

    def port_for(self, engine: str) -> int:
        return self.port if self.port is not None else default_port(engine)

    @property
    def fp8_weights_online(self) -> bool:
        """fp8 weights planned on a checkpoint that does not ship them."""
        return self.weight_dtype == "fp8" and self.checkpoint_format != "fp8"


@dataclass(frozen=True)
class LaunchLine:
    """One engine's command for one replica, the files it reads, and what to tell the user."""

    engine: str
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()
    files: dict[str, str] = field(default_factory=dict)
    """File name -> content, for files the command reads (TensorRT-LLM's options YAML)."""
    note: str = ""
    port: int = 8000

    @property
    def command(self) -> str:
        """The shell line: environment, command, then the note as a shell comment."""
        words = [f"{k}={shlex.quote(v)}" for k, v in self.env]
        words += [shlex.quote(w) for w in self.argv]
        return " ".join(words) + (f"  # {self.note}" if self.note else "")


def deepep_launch(settings: Any, gpu: Any) -> dict[str, str]:
    """Each engine's launch words that run the DeepEP mode its step model costs for a replica
    of `settings` on `gpu` (models/layout.py deepep_mode; EngineProfile.deepep_flags of the
    settings' own profile for its engine, of the newest profile for the others); an engine
    whose replica runs no DeepEP is absent."""
    own, domain = settings.profile, gpu.network_domain
    out = {}
    for engine in ENGINES:
        prof = own if own.name == engine else engine_profile(engine)
        mode = deepep_mode(settings.tp, settings.attention_dp, settings.expert_parallel,
                           settings.deepep_mode or prof.deepep_mode, domain, prof.deepep_flags)
        if mode is not None:
            out[engine] = prof.deepep_flags[mode]
    return out


def split_env(words: str) -> tuple[tuple[tuple[str, str], ...], list[str]]:
    """(environment variables, other words) of launch words: a NAME=VALUE word with an
    upper-case name sets a variable."""
    env, rest = [], []
    for w in words.split():
        name, eq, value = w.partition("=")
        if eq and name.isupper():
            env.append((name, value))
        else:
            rest.append(w)
    return tuple(env), rest


HEAD = "NODE0_IP"
"""Placeholder the user replaces with the first node's address."""
DIST_PORT, DP_RPC_PORT, RAY_PORT = 5000, 13345, 6379


def _shell(line: LaunchLine, extra: list[str]) -> str:
    """The line's command with `extra` words before its note."""
    return replace(line, argv=line.argv + tuple(extra)).command


def node_commands(line: LaunchLine, o: LaunchOptions) -> list[str]:
    """The commands of one replica that spans o.nodes nodes, "node k: ..." (one MPI launch
    "any node: ..."), as its engine's profile launches a replica over hosts
    (EngineProfile.multinode_launch, sources["multinode"]; NODE_COMMANDS)."""
    if o.nodes <= 1:
        return [line.command]
    return NODE_COMMANDS[engine_profile(line.engine).multinode_launch](line, o)


def _node_rank_commands(line: LaunchLine, o: LaunchOptions) -> list[str]:
    """SGLang (python/sglang/srt/server_args.py, v0.5): the same command on every node with
    `--nnodes N --node-rank k --dist-init-addr HEAD:PORT`."""
    n = o.nodes
    return [f"node {k}: " + _shell(line, ["--nnodes", str(n), "--node-rank", str(k),
                                          "--dist-init-addr", f"{HEAD}:{DIST_PORT}"])
            for k in range(n)]


def _mpirun_commands(line: LaunchLine, o: LaunchOptions) -> list[str]:
    """TensorRT-LLM (docs "trtllm-serve", 1.x): `mpirun -H NODE0_IP:G,NODE1_IP:G -np W
    trtllm-llmapi-launch trtllm-serve ...` from any node; mpirun carries the environment to
    every rank (-x)."""
    world = o.tp * o.pp * o.attention_dp
    hosts = ",".join(f"{HEAD if k == 0 else f'NODE{k}_IP'}:{min(o.gpus_per_node, world)}"
                     for k in range(o.nodes))
    env = "".join(f"-x {k}={shlex.quote(v)} " for k, v in line.env)
    return [f"any node: mpirun {env}-H {hosts} -np {world} trtllm-llmapi-launch "
            + replace(line, env=()).command]


def _dp_or_ray_commands(line: LaunchLine, o: LaunchOptions) -> list[str]:
    """vLLM (docs "Data Parallel Deployment", v0.10): data-parallel ranks spread over nodes,
    `--data-parallel-size-local L --data-parallel-address HEAD --data-parallel-rpc-port P`,
    the other nodes `--data-parallel-start-rank k L --headless`; TP or PP wider than a node
    runs on a Ray cluster (`--distributed-executor-backend ray`, docs "Distributed Inference
    and Serving")."""
    n = o.nodes
    if o.attention_dp > 1 and o.tp * o.pp <= o.gpus_per_node:
        local = min(o.attention_dp, max(1, o.gpus_per_node // (o.tp * o.pp)))
        dp = ["--data-parallel-size-local", str(local), "--data-parallel-address", HEAD,
              "--data-parallel-rpc-port", str(DP_RPC_PORT)]
        return [f"node {k}: " + _shell(_side_channel_at(line, k), dp + (
            ["--data-parallel-start-rank", str(k * local), "--headless"] if k else []))
            for k in range(n)]
    # the engine core, on the head, serves a P/D server's NIXL side channel for every rank
    return ([f"node 0: ray start --head --port {RAY_PORT} && "
             + _shell(_side_channel_at(line, 0), ["--distributed-executor-backend", "ray"])]
            + [f"node {k}: ray start --address {HEAD}:{RAY_PORT} --block" for k in range(1, n)])


NODE_COMMANDS: dict[str, Callable[[LaunchLine, LaunchOptions], list[str]]] = {
    "node-rank": _node_rank_commands, "mpirun": _mpirun_commands,
    "dp-or-ray": _dp_or_ray_commands}
"""The commands of a replica over hosts by EngineProfile.multinode_launch."""


def node_gpus(engine: str, world: int, gpus_per_node: int, nodes: int) -> list[int]:
    """The GPUs each of a replica's `nodes` hosts runs, as its commands (`node_commands`) start
    it: SGLang's `--nnodes` splits the world evenly (world / nnodes a node); mpirun's
    `-H NODE0_IP:G,... -np W` and vLLM's data-parallel ranks or Ray fill a host before the
    next."""
    if engine_profile(engine).multinode_launch == "node-rank":
        return [world // nodes] * nodes
    return [min(gpus_per_node, world - k * gpus_per_node) for k in range(nodes)]


def _side_channel_at(line: LaunchLine, k: int) -> LaunchLine:
    """A vLLM P/D server's line on host k of its replica: its data-parallel ranks there run
    their own schedulers, whose NIXL side channel advertises VLLM_NIXL_SIDE_CHANNEL_HOST, so
    it is that host's address (NODEk_IP; HEAD on host 0)."""
    env = dict(line.env)
    if "VLLM_NIXL_SIDE_CHANNEL_PORT" not in env:
        return line
    env["VLLM_NIXL_SIDE_CHANNEL_HOST"] = HEAD if k == 0 else f"NODE{k}_IP"
    return replace(line, env=tuple(env.items()))


def _parallel(engine: str, o: LaunchOptions) -> list[str]:
    """TP/PP/DP/EP words, in the engine's own flags (EngineProfile.flag_names). vLLM's
    --tensor-parallel-size is one attention group's; SGLang's --tp and TensorRT-LLM's --tp_size
    are the whole tp x dp world, which DP attention splits (EngineProfile.tp_flag_is_world,
    models/engine.py sources["layouts"]); vLLM's --enable-expert-parallel is EP = tp x dp."""
    prof, dp, ep = engine_profile(engine), o.attention_dp, o.expert_parallel
    names = prof.flag_names
    tp = str(engine_world(engine, o.tp, dp)["tp"])  # the notation tests/unit round-trips
    w = [names["tp"], tp]
    w += [names["pp"], str(o.pp)] if o.pp > 1 else []
    w += _sized_flag(names["attention_dp"], dp) if dp > 1 else []
    return w + (_sized_flag(names["expert_parallel"], ep) if ep > 1 else [])


def _sized_flag(words: str, n: int) -> list[str]:
    """The command-line words of a flag_names entry for size `n` (at its `{n}`); none for an
    LLM-API options-file line (TensorRT-LLM's attention DP, which `trtllm_line` writes)."""
    text = words.format(n=n)
    return text.split() if text.startswith("--") else []


def _env(o: LaunchOptions, engine: str) -> tuple[tuple[str, str], ...]:
    gpus = (("CUDA_VISIBLE_DEVICES", ",".join(map(str, o.gpu_ids))),) if o.gpu_ids else ()
    return gpus + split_env(o.deepep.get(engine, ""))[0]


def _a2a(o: LaunchOptions, engine: str) -> list[str]:
    """The engine's DeepEP flags (the environment words go in `_env`)."""
    return split_env(o.deepep.get(engine, ""))[1]


def _frac(o: LaunchOptions, engine: str) -> str:
    return f"{o.memory_fraction[engine]:g}"


_TRTLLM = engine_profile("trtllm")
"""TensorRT-LLM's profile: the option lines its line writes (option_flags), its scheduler."""
_NIXL_BOTH = '{"kv_connector":"NixlConnector","kv_role":"kv_both"}'


def vllm_line(o: LaunchOptions) -> LaunchLine:
    """`vllm serve`: --quantization fp8 quantizes a bf16 checkpoint when it loads."""
    w = ["vllm", "serve", o.model_id, *_parallel("vllm", o), *_a2a(o, "vllm"),
         "--max-num-seqs", str(o.max_num_seqs),
         "--max-num-batched-tokens", str(o.max_num_batched_tokens),
         "--gpu-memory-utilization", _frac(o, "vllm"), "--max-model-len", str(o.max_model_len)]
    note = ""
    if o.kv_dtype == "fp8":
        w += ["--kv-cache-dtype", "fp8"]
    # Lanes of different priorities in one pool: served lower values first, as vLLM does with
    # --scheduling-policy priority (SchedulerConfig.policy, 0.10-0.11).
    if o.priority_scheduling:
        w += ["--scheduling-policy", "priority"]
    if o.weight_dtype in _VLLM_QUANT and o.checkpoint_format != o.weight_dtype:
        w += ["--quantization", _VLLM_QUANT[o.weight_dtype]]
    elif o.weight_dtype in ("int4", "int8", "fp4") and o.checkpoint_format != o.weight_dtype:
        note = (f"serve a {o.weight_dtype} checkpoint of {o.model_id} (AWQ/GPTQ/W8A8/NVFP4); "
                "vLLM reads its format")
    env = _env(o, "vllm")
    if o.role is not None:  # vLLM disaggregated prefill (docs: NixlConnector usage)
        w += ["--kv-transfer-config", _NIXL_BOTH]
        if o.kv_handshake is not None:
            host, port = o.kv_handshake
            env += ((("VLLM_NIXL_SIDE_CHANNEL_HOST", host),) if host else ()) + (
                ("VLLM_NIXL_SIDE_CHANNEL_PORT", str(port)),)
    w += ["--host", o.host, "--port", str(o.port_for("vllm")),
          *o.extra.get("vllm", ())]
    return LaunchLine("vllm", tuple(w), env, note=note, port=o.port_for("vllm"))


def sglang_line(o: LaunchOptions) -> LaunchLine:
    """`python -m sglang.launch_server`: --quantization fp8 quantizes when it loads."""
    sglang, dp = engine_profile("sglang"), o.attention_dp  # caps are the DP group's
    w = ["python", "-m", "sglang.launch_server", "--model-path", o.model_id,
         *_parallel("sglang", o), *_a2a(o, "sglang"),
         "--max-running-requests", str(launch_limit(sglang, o.max_num_seqs, dp)),
         "--chunked-prefill-size", str(launch_limit(sglang, o.max_num_batched_tokens, dp)),
         "--mem-fraction-static", _frac(o, "sglang"), "--context-length", str(o.max_model_len)]
    if o.kv_dtype == "fp8":
        w += ["--kv-cache-dtype", "fp8_e4m3"]  # vLLM's fp8 is e4m3 too
    if o.fp8_weights_online:
        w += ["--quantization", "fp8"]
    if o.priority_scheduling:  # SGLang 0.5 ServerArgs: off by default, higher values first
        w += ["--enable-priority-scheduling", "--schedule-low-priority-values-first"]
    if o.role is not None:  # SGLang PD disaggregation (docs: PD Disaggregation)
        w += ["--disaggregation-mode", o.role, "--disaggregation-transfer-backend", "nixl"]
        if o.role == "prefill" and o.kv_handshake is not None:
            w += ["--disaggregation-bootstrap-port", str(o.kv_handshake[1])]
    w += ["--host", o.host, "--port", str(o.port_for("sglang")),
          *o.extra.get("sglang", ())]
    return LaunchLine("sglang", tuple(w), _env(o, "sglang"), port=o.port_for("sglang"))


def fp8_checkpoint_id(model_id: str) -> str:
    """The ModelOpt FP8 checkpoint name NVIDIA publishes for a model (nvidia/<name>-FP8, e.g.
    nvidia/Llama-3.3-70B-Instruct-FP8)."""
    return f"nvidia/{model_id.rstrip('/').rsplit('/', 1)[-1]}-FP8"


def trtllm_line(o: LaunchOptions) -> LaunchLine:
    """`trtllm-serve` (PyTorch backend). Its PyTorch backend does not quantize when it loads:
    fp8 weights come from a ModelOpt FP8 checkpoint (TensorRT-LLM docs, torch/features/
    quantization: "pass quantized models ... generated by Model Optimizer"), so an fp8 plan of
    a bf16 checkpoint serves that checkpoint. KV dtype and attention DP go in the LLM-API
    options file (KvCacheConfig.dtype, enable_attention_dp)."""
    model, note = o.model_id, ""
    if o.fp8_weights_online:
        model = fp8_checkpoint_id(o.model_id)
        note = (f"ModelOpt FP8 checkpoint of {o.model_id}; if NVIDIA does not publish it, make "
                "it with Model-Optimizer examples/llm_ptq (huggingface_example.sh --quant fp8 "
                "--export_fmt hf) and serve that directory")
    elif o.weight_dtype in ("int4", "int8", "fp4") and o.checkpoint_format != o.weight_dtype:
        note = f"serve a ModelOpt {o.weight_dtype} checkpoint of {o.model_id}"
    options: list[str] = []
    if o.kv_dtype == "fp8":
        options += ["kv_cache_config:", "  dtype: fp8"]
    if o.attention_dp > 1:  # its flag_names entry is the options-file line
        options += [_TRTLLM.flag_names["attention_dp"]]
    if "trtllm" in o.deepep:  # the MoE backend DeepEP runs in (deepep_llm_api_options)
        options += list(_TRTLLM.deepep_llm_api_options)
    off = _TRTLLM.option_flags["no-overlap"]  # TorchLlmArgs.disable_overlap_scheduler
    if not o.host_overlap and off not in o.llm_api_options:  # (+no-overlap gives it already)
        options += [off]
    if o.role:  # a context or generation server of `trtllm-serve disaggregated`: its KV
        # transfer (examples/disaggregated/README.md: backend DEFAULT is NIXL; the buffer at
        # least the longest prompt)
        options += ["cache_transceiver_config:", "  backend: DEFAULT",
                    f"  max_tokens_in_buffer: {o.max_model_len}"]
    options += list(o.llm_api_options)
    # whole prompts (no chunking by default): max_num_tokens holds the longest accepted one;
    # with enable_chunked_prefill it is the planned chunk
    chunked = _TRTLLM.option_flags["chunked-prefill"] in options
    policy = replace(_TRTLLM.scheduler, chunked_prefill=chunked)
    w = ["trtllm-serve", model, "--backend", "pytorch", *_parallel("trtllm", o),
         "--max_batch_size", str(o.max_num_seqs),
         "--max_num_tokens", str(policy.launched_budget(o.max_num_batched_tokens,
                                                        o.max_model_len)),
         "--kv_cache_free_gpu_memory_fraction", _frac(o, "trtllm"),
         "--max_seq_len", str(o.max_model_len)]
    files = {}
    if options:
        name = TRTLLM_ROLE_FILES.get(o.role or "", TRTLLM_OPTIONS_FILE)
        w += ["--extra_llm_api_options", name]
        files[name] = "\n".join(options) + "\n"
    w += ["--host", o.host, "--port", str(o.port_for("trtllm")),
          *o.extra.get("trtllm", ())]
    return LaunchLine("trtllm", tuple(w), _env(o, "trtllm"), files, note, o.port_for("trtllm"))


BUILDERS: dict[str, Callable[[LaunchOptions], LaunchLine]] = {
    "vllm": vllm_line, "sglang": sglang_line, "trtllm": trtllm_line}


def launch_line(engine: str, o: LaunchOptions) -> LaunchLine:
    return BUILDERS[engine](o)


def max_model_len_choice(model_max: int, p99_input: float, p99_output: float,
                         given: int | None) -> tuple[int, str]:
    """The max-model-len a plan launches with, and why (printed beside the launch lines).

    Unset, it is twice the p99 request (p99 prompt + p99 output) rounded up to a power of two,
    at least 4096 and at most the model's context: room for the tail the plan saw, so the
    server does not reject a longer prompt than the plan's p99 (a prompt + output above it
    is rejected by the engine: vLLM checks it in its input processor)."""
    if given:
        return given, f"max-model-len {given}: engine.max_model_len in the plan"
    need = p99_input + p99_output
    auto = min(model_max, max(4096, 2 ** math.ceil(math.log2(max(2 * need, 1.0)))))
    capped = " (the model's maximum)" if auto == model_max and auto < 2 * need else ""
    return auto, (f"max-model-len {auto}{capped}: 2 x (p99 prompt {p99_input:.0f} + p99 output "
                  f"{p99_output:.0f} tokens, the p99s of the planned sample of requests) "
                  "rounded up to a power of two, at least 4096; a "
                  "longer request is rejected by the server, set engine.max_model_len to "
                  "allow it (KV capacity is unchanged, the per-sequence limit grows)")


def options_from(rec: dict[str, Any], model_id: str, checkpoint_format: str,
                 memory_fraction: dict[str, float], **kw: Any) -> LaunchOptions:
    """LaunchOptions from a recommendation's settings dict (Recommendation.settings_dict);
    its speculative decoding, LoRA and image settings become extra words and LLM-API lines
    (capplan.plan.feature_flags)."""
    extra, api_lines = feature_launch(rec, model_id)
    # the planned engine's profile options (sglang+mixed-chunk, trtllm+no-overlap) on its line
    prof = engine_profile(rec.get("engine_profile") or rec.get("engine") or "vllm")
    words, option_lines = prof.option_launch()
    extra = {**extra, prof.name: (*extra.get(prof.name, ()), *words)}
    api_lines = (*api_lines, *option_lines)
    return replace(LaunchOptions(
        model_id=model_id, tp=rec["tp"], pp=rec.get("pp", 1),
        attention_dp=rec.get("attention_dp", 1), expert_parallel=rec.get("expert_parallel", 1),
        max_num_seqs=rec["max_num_seqs"], max_num_batched_tokens=rec["max_num_batched_tokens"],
        memory_fraction=memory_fraction, max_model_len=rec["max_model_len"],
        weight_dtype=rec["weight_dtype"], checkpoint_format=checkpoint_format,
        kv_dtype=rec["kv_dtype"], extra={e: w for e, w in extra.items() if w},
        llm_api_options=api_lines, deepep=rec.get("deepep") or {}), **kw)
