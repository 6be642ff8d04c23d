"""AIConfigurator's benchmarks as capplan predicts them.

AIConfigurator's silicon data (`../shared/validation/silicon_sample.csv`, Apache-2.0) records
mean TTFT and TPOT of engines run by its benchmark generator under a closed loop of C clients.
This module holds what capplan needs to predict one such run, so that a harness only reads rows
and scores (benchmarks/validate_silicon.py, silicon_loso.py, validate_disagg.py):

- the deployment a run used: its engine, layout and dtypes, and the settings the generator
  launched (`capplan.sim.protocol.aiconfigurator_settings`), `agg_deployment`;
- what its benchmark reports, from the analytic closed loop (`agg_closed_loop`, the reported
  TTFT of `capplan.sim.protocol.reported_ttft`) or from the replay of its measured phase
  (`benchmark_replay`, `measured_mean`, `replayed_means`);
- which engine release profile a run's recorded version maps to (`release_label`,
  `release_engine`);
- a disaggregated run's worker (`disagg_worker_options`, `disagg_worker`).

docs/validation.md (sections 3-5) has the scores and the protocol's sources.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any

from capplan import limits
from capplan.catalog.loader import Catalog
from capplan.models.closed_loop import BenchmarkProtocol, closed_loop_latency
from capplan.models.engine import (
    ClientJitter,
    SchedulerPolicy,
    engine_profile,
    profile_for_version,
)
from capplan.plan.deployment import (
    Deployment,
    EngineOptions,
    calibration_for,
    resolve_deployment,
)
from capplan.sim.protocol import aiconfigurator_settings

SYSTEM_GPUS = {"h100_sxm": "h100-sxm", "h200_sxm": "h200", "b200_sxm": "b200",
               "b300_sxm": "b300", "gb200": "gb200", "gb300": "gb300"}
"""AIConfigurator's system names -> catalog GPU keys."""
MEASURED_ROUNDS = 20
"""AIConfigurator's bench_run.sh.j2: --num-requests 20 x concurrency (docs/validation.md)."""
REPLAY_ROUNDS = 20
"""Rounds of a closed-loop benchmark replayed: all of AIPerf's 20, because the clients fall out
of step over the rounds (each request overhead's own delay, models.engine.closed_loop_delay),
so rounds 2-4 still hold part of the start-up wave. A run whose rounds would decode more than
the sim_tokens limit replays fewer (`replay_rounds`) and repeats the mean of rounds 2..k for
the rest (`measured_mean`)."""
MIN_REPLAY_ROUNDS = 4
"""The fewest rounds `replay_rounds` replays, whatever the limit (the wave and three more)."""


@dataclass(frozen=True, kw_only=True)
class AggRun:
    """One aggregated (`agg`) benchmark run: one engine serving a closed loop."""

    backend: str
    """The engine as AIConfigurator names it (vllm, sglang, trtllm): its generator's rules."""
    model: str
    """Model id (Hugging Face id or catalog key)."""
    system: str
    """AIConfigurator's system name (SYSTEM_GPUS)."""
    precision: str
    """AIConfigurator's precision column (fp8, fp4, int4, bf16, or empty: the checkpoint's)."""
    tp: int
    """GPUs per attention-DP rank: tp_size x pp_size."""
    isl: int
    osl: int
    batch_size: int
    """The generator's running-request cap (0: unset)."""
    concurrency: int
    """Clients of the closed loop."""
    attention_dp: int = 1
    expert_parallel: int = 1
    engine: str | None = None
    """Engine profile spec to run (None: `backend`'s current profile)."""


def agg_weight_dtype(precision: str, own: str | None) -> str:
    """The weight dtype a run's precision asks for, given the checkpoint's own format: `auto`
    when they agree (an FP4 run of an MXFP4/NVFP4 checkpoint keeps its own FP4 format)."""
    if not precision or precision == own:
        return "auto"
    if precision in ("fp4", "nvfp4") and own in ("mxfp4", "fp4", "nvfp4"):
        return "auto"
    if precision == "int4" and own == "int4":
        return "auto"
    return {"fp8": "fp8", "fp4": "fp4", "int4": "int4", "bf16": "bf16"}.get(precision, "auto")


def run_kv_dtype(precision: str) -> str:
    """KV in fp8 for fp8/fp4 precision (AIConfigurator's quantized configurations quantize the
    KV cache too), else the engine's default."""
    return "fp8" if precision in ("fp8", "fp4", "nvfp4") else "auto"


def agg_deployment(cat: Catalog, run: AggRun, calibration: dict[str, float] | None = None
                   ) -> Deployment:
    """The deployment of a run: its engine, layout and dtypes, with the settings
    AIConfigurator's generator launched (not the engines' own defaults: a different per-step
    token budget changes how many prompts share a prefill step, which is most of the closed
    loop's TTFT). `calibration`: fields replaced in the GPU's calibration (a fit's trials)."""
    res = cat.resolve_model(run.model)
    own = res.spec.quantization.format if res.spec.quantization else res.spec.torch_dtype
    got = aiconfigurator_settings(run.backend, run.isl, run.osl, run.batch_size,
                                  run.concurrency, run.attention_dp)
    opts = EngineOptions(engine=run.engine or run.backend, tp=run.tp,
                         weight_dtype=agg_weight_dtype(run.precision, own),
                         kv_dtype=run_kv_dtype(run.precision), attention_dp=run.attention_dp,
                         expert_parallel=run.expert_parallel, **got["options"])
    gpu = cat.gpu(SYSTEM_GPUS[run.system])
    cal = calibration_for(cat, gpu, None)
    if calibration:
        cal = cal.with_(**calibration)
    return resolve_deployment(cat, run.model, gpu.key, opts, cal)


def agg_policy(dep: Deployment, run: AggRun) -> SchedulerPolicy:
    """The scheduler the benchmark ran: the profile's, with prefill chunks riding with the
    decode batch where the generator enabled it (SGLang's enable_mixed_chunk) and the prompt
    budget it set (SGLang's max_prefill_tokens, SchedulerPolicy.max_prefill_tokens)."""
    policy = dep.settings.profile.scheduler
    got = aiconfigurator_settings(run.backend, run.isl, run.osl, run.batch_size,
                                  run.concurrency, run.attention_dp)
    if got["max_prefill_tokens"] is not None:
        policy = replace(policy, max_prefill_tokens=got["max_prefill_tokens"])
    return replace(policy, prefill_first=False) if got["mixed_prefill"] else policy


def agg_closed_loop(dep: Deployment, run: AggRun, measured: int,
                    jitter: ClientJitter | None = None) -> dict[str, Any]:
    """The analytic closed loop of the run (models/closed_loop.py) over `measured` requests:
    `ttft_wave_s`, `ttft_steady_s`, `tpot_s`, `request_overhead_s` (the reported TTFT is
    capplan.sim.protocol.reported_ttft of them). `jitter` replaces the profile's client
    jitter. A whole-prompt engine's budget holds a prompt (the benchmark sized it so); an
    engine with a prompt budget beside its chunk (SGLang's max_prefill_tokens) steps at most
    that budget's prompt tokens beside its decodes; the replica's caps and budget are its
    attention-DP ranks' together."""
    s = dep.settings
    budget = s.max_num_batched_tokens
    if not s.profile.scheduler.chunked_prefill:
        budget = max(budget, run.isl)
    # the window layers' cap follows the chunk a step computes: the (raised) token budget
    layout = dep.pool.layout.for_budget(dep.pool.block_size, budget)
    policy = agg_policy(dep, run)
    if policy.whole_prompts_after_first and policy.max_prefill_tokens > 0:
        budget = min(budget, policy.max_prefill_tokens + s.max_num_seqs)
    jit = s.profile.client_jitter if jitter is None else jitter
    lim = dep.limits
    return closed_loop_latency(dep.step, run.isl, run.osl, lim.max_num_seqs,
                               budget * s.attention_dp, lim.kv_cache_tokens, s.block_size,
                               BenchmarkProtocol(run.concurrency, measured, client_jitter=jit),
                               policy, layout=layout)


def agg_closed_loop_replay(dep: Deployment, run: AggRun, measured: int,
                           jitter: ClientJitter | None = None) -> dict[str, Any]:
    """The run's closed loop replayed by the simulator (plan.verify.simulate_closed_loop) with
    the same policy and jitter as agg_closed_loop."""
    from capplan.plan.verify import simulate_closed_loop

    jit = dep.settings.profile.client_jitter if jitter is None else jitter
    return simulate_closed_loop(dep, run.concurrency, run.isl, run.osl, requests=measured,
                                client_jitter=jit, policy=agg_policy(dep, run))


def benchmark_replay(dep: Deployment, concurrency: int, isl: int, osl: int, requests: int
                     ) -> dict[str, Any]:
    """The benchmark's measured phase replayed: `concurrency` clients start together, each
    sending its next request when its last one ends (plus the request overhead's own delay,
    models.engine.closed_loop_delay), `requests`
    in all; what the clients measure (the loop compiled when numba imports)."""
    from capplan.plan.verify import simulate_closed_loop

    return simulate_closed_loop(dep, concurrency, isl, osl, requests=requests, seed=0)


def replay_rounds(concurrency: int, output_tokens: float) -> int:
    """Rounds to replay of a closed loop of `concurrency` clients whose requests decode
    `output_tokens` each: REPLAY_ROUNDS, fewer when their decoding exceeds the sim_tokens
    limit, at least MIN_REPLAY_ROUNDS (or REPLAY_ROUNDS itself when set below it: the
    harness's `--replay-rounds` what-if)."""
    fit = int(limits.cap("sim_tokens") // max(float(concurrency) * float(output_tokens), 1.0))
    return max(min(REPLAY_ROUNDS, fit), min(MIN_REPLAY_ROUNDS, REPLAY_ROUNDS))


def later_rounds_mean(wave: float, first_rounds: float, k: int = REPLAY_ROUNDS) -> float:
    """The mean of rounds 2..k, from the mean of the first round (the start-up wave: `wave`)
    and of the first k rounds (`first_rounds`); the wave's own when only it was replayed."""
    if k <= 1:
        return wave
    return (k * first_rounds - wave) / (k - 1)


def rounds_mean(wave: float, later: float, rounds: float = MEASURED_ROUNDS) -> float:
    """The mean over `rounds` rounds (default MEASURED_ROUNDS): one start-up wave, the rest at
    the later rounds' mean."""
    return (wave + (rounds - 1) * later) / rounds


def measured_mean(wave: float, first_rounds: float, rounds: float = MEASURED_ROUNDS,
                  k: int = REPLAY_ROUNDS) -> float:
    """The mean over `rounds` rounds (default MEASURED_ROUNDS) from replays of the first round
    (the start-up wave: `wave`) and of the first k rounds (`first_rounds`): the later rounds
    repeat the mean of rounds 2..k (`replay_rounds`)."""
    return rounds_mean(wave, later_rounds_mean(wave, first_rounds, k), rounds)


def replayed_means(dep: Deployment, concurrency: int, isl: int, osl: int
                   ) -> tuple[float, float, float]:
    """(TTFT, TPOT) means the benchmark reports over MEASURED_ROUNDS rounds (a replay of all of
    them, or of the first `replay_rounds` and one of the start-up wave, `measured_mean`), and
    the mean running batch."""
    k = min(replay_rounds(concurrency, osl), MEASURED_ROUNDS)
    out = benchmark_replay(dep, concurrency, isl, osl, k * concurrency)
    if k >= MEASURED_ROUNDS:
        return out["ttft_s"]["mean"], out["tpot_s"]["mean"], out["mean_running_batch"]
    wave = benchmark_replay(dep, concurrency, isl, osl, concurrency)
    return (measured_mean(wave["ttft_s"]["mean"], out["ttft_s"]["mean"], k=k),
            measured_mean(wave["tpot_s"]["mean"], out["tpot_s"]["mean"], k=k),
            out["mean_running_batch"])


def release_label(version: str) -> str:
    """A run's engine release as AIConfigurator recorded it ("" -> "unlabelled"; nightly and
    model-specific builds -> "dev")."""
    v = version.strip()
    if not v:
        return "unlabelled"
    return v if re.match(r"^\d", v) else "dev"


def release_engine(backend: str, label: str) -> str:
    """The engine spec a run replays with: its release's profile (unlabelled and dev builds:
    the newest), SGLang with +mixed-chunk as AIConfigurator's benchmark launched it."""
    prof = profile_for_version(backend, None if label in ("unlabelled", "dev") else label)
    spec = f"{backend}@{prof.version}"
    if backend == "sglang":
        spec += "+mixed-chunk"
    return engine_profile(spec).spec


def disagg_worker_options(row: dict[str, str], role: str) -> EngineOptions:
    """A disaggregated run's prefill or decode worker (`role`) as AIConfigurator's columns give
    it: tp_size x attention_dp_size GPUs (x pp_size), MoE layers over moe_ep_size ranks, the
    run's precision as the weight dtype, and its batch_size as the engine's running cap per
    attention-DP rank when the row sets it."""
    def size(v: str) -> int:
        return int(v) if v and int(v) > 0 else 1

    bs = size(row[f"{role}_batch_size"]) if row[f"{role}_batch_size"] else None
    isl, osl = int(row["isl"]), int(row["osl"])
    return EngineOptions(engine=row["backend"], tp=size(row[f"{role}_tp_size"]),
                         pp=size(row[f"{role}_pp_size"]),
                         attention_dp=size(row[f"{role}_attention_dp_size"]),
                         expert_parallel=size(row[f"{role}_moe_ep_size"]),
                         weight_dtype={"fp8": "fp8", "fp4": "fp4"}.get(row["precision"], "auto"),
                         kv_dtype="fp8" if row["precision"] in ("fp8", "fp4") else "auto",
                         max_model_len=isl + osl + 16, max_num_seqs=bs)


def disagg_worker(cat: Catalog, row: dict[str, str], role: str) -> Deployment:
    """A disaggregated run's worker (disagg_worker_options) on the row's GPU. An engine that
    prefills whole prompts runs only with a token budget that holds one (TensorRT-LLM rejects
    a request longer than max_num_tokens without chunking): the deployment measured set it so."""
    opts = disagg_worker_options(row, role)
    gpu = SYSTEM_GPUS[row["system"]]
    dep = resolve_deployment(cat, row["model_path"], gpu, opts)
    isl = int(row["isl"])
    if not dep.profile.scheduler.chunked_prefill and dep.settings.max_num_batched_tokens < isl:
        dep = resolve_deployment(cat, row["model_path"], gpu,
                                 replace(opts, max_num_batched_tokens=isl))
    return dep
