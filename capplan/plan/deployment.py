"""The one deployment resolver: (model, GPU, engine, options, calibration) -> a Deployment.

Every door (the CLI commands, the planner, the benchmarks, the Python API) turns names and
options into a deployment here and nowhere else, so the same question always gets the same
engine defaults: the engine profile's per-GPU defaults fill what the user left out, the
checkpoint's implied dtype applies to `auto`, and the fit check is made once.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

from capplan.catalog.calibration import (
    calibration_device,
    find_default_calibration,
    load_calibration,
)
from capplan.catalog.loader import Catalog
from capplan.catalog.schema import GpuSpec, ModelSpec
from capplan.errors import CatalogError, InputError
from capplan.models.calibration import Calibration
from capplan.models.engine import (
    EngineProfile,
    EngineSettings,
    check_step_budget,
    engine_profile,
    rank_default,
    same_latency_model,
)
from capplan.models.features import FEATURE_FIELDS, resolve_draft_model
from capplan.models.layers import DENSE_LAYOUT, BlockLayout
from capplan.models.layout import describe, nodes_spanned
from capplan.models.memory import MemoryReport, memory_report
from capplan.models.perf import StepModel, build_step_model, settings_deepep_mode
from capplan.models.queueing import Limits
from capplan.models.speculative import NOT_NEEDED
from capplan.units import GIB_BYTES, cdiv

# Below this much memory left outside the engine's budget, CUDA graphs or a second process
# are likely to OOM: a warning, not an error (vLLM itself does not check it).
LOW_MARGIN_BYTES = 0.25 * GIB_BYTES


@dataclass(frozen=True)
class EngineOptions:
    """What a user may set; None means "the engine's default for this GPU"."""

    engine: str = "vllm"
    tp: int = 1
    pp: int = 1
    weight_dtype: str = "auto"
    kv_dtype: str = "auto"
    max_model_len: int | None = None
    gpu_memory_utilization: float | None = None
    """The engine's memory fraction in its own meaning (vLLM --gpu-memory-utilization, SGLang
    --mem-fraction-static, TensorRT-LLM free_gpu_memory_fraction)."""
    block_size: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    enforce_eager: bool = False
    attention_dp: int = 1
    expert_parallel: int = 1
    speculative: str | None = None
    spec_tokens: int | None = None
    spec_topk: int = 1
    spec_draft_tokens: int | None = None
    acceptance_length: float | None = None
    spec_workload: str = "chat"
    max_loras: int = 0
    max_lora_rank: int = 16
    lora_adapters: int = 0
    lora_popularity: str = "uniform"
    images_per_request: int = 0
    image_width: int = 1024
    image_height: int = 1024

    @classmethod
    def from_settings(cls, s: EngineSettings) -> EngineOptions:
        """Options that pin every value of fully-specified settings."""
        return cls(**{f.name: getattr(s, f.name) for f in fields(cls)})


@dataclass(frozen=True)
class KvPool:
    """One replica's paged KV pool as the simulator, the queueing model and the closed loop
    count it: `num_blocks` blocks of `block_size` tokens (the size vLLM raises for hybrids),
    of which a running sequence's recurrent state holds `state_blocks_per_seq` from admission
    to finish besides its ceil(tokens / block_size) token blocks (vLLM V1's hybrid allocator;
    models/layers.state_blocks_per_seq)."""

    num_blocks: int
    block_size: int
    state_blocks_per_seq: int = 0
    layout: BlockLayout = DENSE_LAYOUT
    """How a sequence's tokens fill the pool: sliding-window layers capped at their window's
    blocks (models/layers.block_layout; the simulator counts blocks in its unit)."""

    @property
    def state_tokens_per_seq(self) -> int:
        """The state in tokens of KV capacity (what kv_cache_tokens counts)."""
        return self.state_blocks_per_seq * self.block_size

    def sequences_at(self, context_len: int) -> int:
        """Sequences of context_len tokens the pool holds at once: its blocks over a sequence's
        (window layers capped, models/layers.BlockLayout; its recurrent state's)."""
        lay = self.layout
        per_seq = (lay.blocks(cdiv(int(context_len), self.block_size))
                   + lay.sim_blocks(self.state_blocks_per_seq))
        return lay.sim_blocks(self.num_blocks) // max(per_seq, 1)

    @classmethod
    def of(cls, mem: MemoryReport) -> KvPool:
        return cls(mem.num_gpu_blocks, mem.block_size, mem.state_blocks_per_seq,
                   mem.block_layout)


@dataclass(frozen=True)
class Deployment:
    model: ModelSpec
    gpu: GpuSpec
    settings: EngineSettings
    calibration: Calibration
    memory: MemoryReport
    step: StepModel
    served_id: str = ""
    """The checkpoint id the user named (what launch lines serve); the catalog id if none."""

    @property
    def gpus_per_replica(self) -> int:
        s = self.settings
        return s.tp * s.pp * s.attention_dp

    @property
    def profile(self) -> EngineProfile:
        return self.settings.profile

    @property
    def pool(self) -> KvPool:
        """The KV block pool every simulation of this deployment runs on."""
        pool = KvPool.of(self.memory)
        dp = self.settings.attention_dp
        if dp == 1:
            return pool
        # Attention DP: each rank holds its own pool and scheduler; the replica is simulated as
        # one pool of dp x the rank's blocks (requests balanced evenly over the ranks).
        return replace(pool, num_blocks=pool.num_blocks * dp)

    @property
    def limits(self) -> Limits:
        """The engine limits the analytic queueing model takes (hybrid state included)."""
        return Limits.of_replica(self.settings, self.memory.replica_kv_cache_tokens, self.pool)

    @property
    def layout_text(self) -> str:
        """'8 GPUs: attention TP 1 x DP 8, EP 8', '16 GPUs over 2 nodes: TP 16' (footers)."""
        s = self.settings
        return describe(s.tp, s.pp, s.attention_dp, s.expert_parallel,
                        self.gpu.interconnect.max_gpus_per_node)

    @property
    def nodes(self) -> int:
        """NVLink domains (nodes; racks on NVL72) one replica spans."""
        return nodes_spanned(self.gpus_per_replica, self.gpu.interconnect.max_gpus_per_node)

    @property
    def deepep_mode(self) -> str | None:
        """The DeepEP mode the replica's expert all-to-all runs in, as its step model costs it
        and its launch lines set it; None when it runs none (models/perf.settings_deepep_mode)."""
        return settings_deepep_mode(self.settings, self.gpu.network_domain)

    def resolved_dtypes(self) -> dict[str, str]:
        """The dtypes the deployment runs in, `auto` resolved: weights as the memory model
        loads them (the checkpoint's own, e.g. mxfp4 experts), KV in the model's activation
        dtype (vLLM's --kv-cache-dtype auto). JSON `weight_dtype`, `kv_dtype` of latency,
        simulate and speed."""
        kv = self.settings.kv_dtype
        return {"weight_dtype": self.memory.weight_dtype,
                "kv_dtype": self.model.torch_dtype if kv == "auto" else kv}

    def memory_json(self) -> dict[str, object]:
        """`capplan memory --format json` and `capplan.memory(...).to_dict()`: the memory
        report (SI units) with the layout it is for."""
        r, s = self.memory, self.settings
        return {"model": self.model.key, "gpu": self.gpu.key, "tp": s.tp, "pp": s.pp,
                "engine": s.engine, "engine_profile": self.profile.pinned,
                **{k: v for k, v in asdict(r).items() if k != "block_layout"},
                "expert_parallel": s.expert_parallel, "gpus_per_replica": self.gpus_per_replica,
                "replica_kv_cache_tokens": r.replica_kv_cache_tokens,
                "nodes_per_replica": self.nodes, "layout": self.layout_text}

    def settings_summary(self) -> dict[str, object]:
        """The resolved engine settings every output reports (JSON keys, SI)."""
        s = self.settings
        return {"engine": s.engine, "engine_profile": self.profile.pinned, "tp": s.tp, "pp": s.pp,
                "attention_dp": s.attention_dp, "expert_parallel": s.expert_parallel,
                "weight_dtype": self.memory.weight_dtype, "kv_dtype": s.kv_dtype,
                "max_num_seqs": s.max_num_seqs,
                "max_num_batched_tokens": s.max_num_batched_tokens,
                "memory_fraction": s.gpu_memory_utilization, "block_size": s.block_size,
                "max_model_len": self.memory.max_model_len, "served_id": self.served_id,
                "calibration": self.calibration.source,
                "gpus_per_replica": self.gpus_per_replica, "nodes_per_replica": self.nodes,
                "layout": self.layout_text, **self.features_summary()}

    def features_summary(self) -> dict[str, object]:
        """Speculative decoding, LoRA and image settings in effect (empty when none is on)."""
        from capplan.plan.features_plan import features_dict

        out: dict[str, object] = dict(features_dict(self.settings))
        if self.settings.images_per_request:
            from capplan.models.vision import plan_vision

            vl = plan_vision(self.model, self.settings)
            if vl is not None:
                out.update(image_tokens_per_image=vl.tokens_per_image,
                           encoder_flops_per_image=vl.encoder_flops_per_image)
        if self.step.spec_source and not self.step.spec_source.endswith(NOT_NEEDED):
            out.update(spec_acceptance_length=float(self.step.spec_accept_len),
                       spec_acceptance_source=self.step.spec_source)
        return out

    def warnings(self) -> list[str]:
        """Things a user should hear about this deployment (printed on stderr by the CLI)."""
        out = []
        if 0 <= self.memory.margin_bytes_per_gpu < LOW_MARGIN_BYTES:
            out.append(f"only {self.memory.margin_bytes_per_gpu / GIB_BYTES:.2f} GiB left "
                       f"outside the {self.profile.name} memory budget (CUDA graphs, other "
                       "processes): lower the memory fraction if the engine runs out of memory")
        fitted = self.calibration.engine
        here = self.profile.label
        if fitted and not _fitted_here(fitted, self.profile):
            out.append(f"the calibration ({self.calibration.source}) was fitted through "
                       f"{fitted}'s latency model, this run uses {here}: its host costs "
                       "belong to that engine (measure this one, or pass its --engine)")
        if self.calibration.model and self.calibration.model != self.model.key:
            out.append(f"the calibration ({self.calibration.source}) was fitted from levels "
                       f"measured with {self.calibration.model}, this run is of "
                       f"{self.model.key}: its host costs and request overhead belong to that "
                       "model's server")
        return out


def _fitted_here(fitted: str, profile: EngineProfile) -> bool:
    """Whether a calibration fitted through profile `fitted` ("vllm 0.14") holds for `profile`:
    the same engine and a release whose latency model is the same (releases that differ in
    memory accounting alone share host costs)."""
    words = fitted.split()  # the profile's label: "sglang 0.5 +mixed-chunk"
    if not words or words[0] != profile.name:
        return False
    try:
        spec = (f"{words[0]}@{words[1]}" if len(words) > 1 else words[0]) + "".join(words[2:])
        return same_latency_model(engine_profile(spec), profile)
    except (InputError, KeyError):
        return False


def feature_options(opts: EngineOptions) -> dict[str, object]:
    """The feature settings (speculation, LoRA, vision) of options, as EngineSettings takes."""
    return {k: getattr(opts, k) for k in FEATURE_FIELDS}


def resolve_settings(opts: EngineOptions, gpu: GpuSpec, implied_dtype: str | None = None
                     ) -> EngineSettings:
    """EngineSettings with the engine profile's defaults for this GPU where `opts` has None."""
    profile = engine_profile(opts.engine)
    d = profile.defaults(gpu, opts.tp)
    block = opts.block_size if opts.block_size is not None else d.block_size
    if block not in profile.block_sizes:
        raise InputError(f"block size {block}: {profile.name} accepts "
                         f"{', '.join(map(str, profile.block_sizes))}")
    wd = opts.weight_dtype
    if wd == "auto" and implied_dtype:
        wd = implied_dtype
    return EngineSettings(
        tp=opts.tp, pp=opts.pp, weight_dtype=wd, kv_dtype=opts.kv_dtype,
        max_model_len=opts.max_model_len,
        gpu_memory_utilization=(opts.gpu_memory_utilization
                                if opts.gpu_memory_utilization is not None
                                else d.memory_fraction),
        block_size=block,
        max_num_seqs=opts.max_num_seqs or d.max_num_seqs,
        max_num_batched_tokens=opts.max_num_batched_tokens or (
            max(d.max_num_batched_tokens, opts.max_model_len or 0)
            if profile.budget_covers_model_len
            else rank_default(profile, d.max_num_batched_tokens, opts.attention_dp)),
        enforce_eager=opts.enforce_eager, engine=profile.spec,
        attention_dp=opts.attention_dp, expert_parallel=opts.expert_parallel,
        **feature_options(opts))


def calibration_for(cat: Catalog, gpu: GpuSpec, path: str | Path | Calibration | None
                    ) -> Calibration:
    """A calibration file, a Calibration as given, a measured one for the GPU, or defaults."""
    if isinstance(path, Calibration):
        return path
    if path:
        return load_calibration(path, gpu)
    return find_default_calibration(gpu, cat.calibration_dirs)


def device_for(cat: Catalog, gpu_name: str, calibration: str | Path | Calibration | None
               ) -> GpuSpec:
    """The catalog GPU of that name, or the host device a CPU calibration file measured when
    `gpu_name` is that file's device key (`--gpu cpu-x86_64-2c --calibration cpu.yaml`)."""
    try:
        return cat.gpu(gpu_name)
    except CatalogError:
        if calibration is None or isinstance(calibration, Calibration):
            raise
        host = calibration_device(calibration)
        if host is None or host.key != gpu_name:
            raise
        return host


def build_deployment(model: ModelSpec, gpu: GpuSpec, settings: EngineSettings,
                     calibration: Calibration, served_id: str = "",
                     memory_only: bool = False) -> Deployment:
    """memory_only: for a memory answer, which needs no speculative acceptance length."""
    mem = memory_report(model, gpu, settings)
    step = build_step_model(model, gpu, settings, calibration, need_accept_len=not memory_only)
    return Deployment(model, gpu, settings, calibration, mem, step, served_id or model.hf_id)


def resolve_deployment(cat: Catalog, model_name: str, gpu_name: str,
                       options: EngineOptions | EngineSettings | None = None,
                       calibration: str | Path | Calibration | None = None, *,
                       require_fit: bool = False, memory_only: bool = False) -> Deployment:
    """Names and options -> Deployment, the engine profile's defaults filling what is unset.

    `options` may be EngineSettings (every value pinned, as library code builds them) or
    EngineOptions (None = the engine's default for the GPU). A weight-dtype suffix in the model
    name (-FP8...) applies when the dtype is auto. With `require_fit`, a model that does not fit
    raises InputError naming why. `memory_only`: for a memory answer (no acceptance length
    demanded). A token budget below the running-sequence cap is refused as the replay refuses
    it (capplan.models.engine.check_step_budget).
    """
    resolved = cat.resolve_model(model_name)
    gpu = device_for(cat, gpu_name, calibration)
    if options is None:
        options = EngineOptions()
    if isinstance(options, EngineSettings):
        options = EngineOptions.from_settings(options)
    settings = resolve_settings(options, gpu, resolved.implied_weight_dtype)
    settings = resolve_draft_model(cat, settings)
    check_step_budget(settings.max_num_batched_tokens, settings.max_num_seqs,
                      settings.profile.scheduler)
    dep = build_deployment(resolved.spec, gpu, settings, calibration_for(cat, gpu, calibration),
                           getattr(resolved, "served_id", "") or "", memory_only)
    if require_fit and not dep.memory.fits:
        raise InputError(f"{dep.model.key} does not fit on {gpu.key} with TP {settings.tp} "
                         f"under {settings.engine}: {dep.memory.reason} (see `capplan memory`)")
    return dep
