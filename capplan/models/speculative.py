"""Speculative decoding: the drafter's memory, its cost per step, and the acceptance length.

One speculative engine step, for each running sequence (vLLM V1 `EagleProposer` /
`NgramProposer` + rejection sampler; SGLang `EAGLEWorker`):
    draft   = `num_steps` forward passes of the drafter over `topk` tokens per sequence
              (EAGLE/EAGLE-3: one decoder layer + fc + head; MTP: the model's next-token layer;
              a draft model: the whole small model; n-gram: a CPU lookup, no GPU pass);
    verify  = one pass of the target over `verify_tokens` tokens per sequence (chain: K + 1,
              the K drafts and the bonus position; tree: SGLang's num_draft_tokens);
    emitted = the acceptance length tau tokens per sequence on average (1 <= tau <= K + 1).
The step model (capplan.models.perf.step_parts) prices the draft passes and the wider
verification pass with its own roofline, and charges each emitted token 1/tau of that step, so
the simulator and the queueing model, which advance one token per sequence per step, see the
speculative time per token without a second scheduler (docs/features.md, "Speculative
decoding").

Default acceptance: per-position acceptance alpha is taken as constant along the draft, so a
chain of K drafts emits tau(K) = (1 - alpha^(K+1)) / (1 - alpha) tokens (Leviathan et al. 2023,
eq. 1); alpha is solved from one published (K, tau) measurement per method and workload kind
(`ACCEPTANCE`, each cited). A measured acceptance length (`--acceptance-length`, from a server's
spec-decode metrics: 1 + accepted / drafts) replaces it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from capplan.errors import InputError

METHODS = ("eagle3", "eagle", "mtp", "ngram", "draft")
WORKLOAD_KINDS = ("chat", "code", "math", "summarisation")

DEFAULT_SPEC_TOKENS = {"eagle3": 3, "eagle": 3, "mtp": 1, "ngram": 5, "draft": 3}
"""Draft length when --spec-tokens is unset: vLLM docs/features/spec_decode.md examples
(EAGLE/EAGLE-3 and a draft model num_speculative_tokens 2-3, we take 3; n-gram 5); MTP 1
(DeepSeek-V3 trains one MTP module, arXiv:2412.19437 sec. 2.2)."""

EAGLE3_DRAFT_VOCAB = 32000
"""EAGLE-3 heads predict over a reduced vocabulary (yuhuili/EAGLE3-LLaMA3.1-Instruct-8B
config.json `draft_vocab_size` 32000; vLLM llama_eagle3.py maps it back with d2t)."""


@dataclass(frozen=True)
class Acceptance:
    """One published (draft length, acceptance length) measurement for a method and kind."""

    spec_tokens: int
    accept_len: float
    source: str
    spread: str

    @property
    def alpha(self) -> float:
        return solve_alpha(self.accept_len, self.spec_tokens)


_EAGLE3_CHAT = Acceptance(
    7, 3.53, "vLLM issue 26191: Llama-3.1-8B-Instruct + yuhuili/EAGLE3-LLaMA3.1-Instruct-8B, "
    "MT-Bench 80 prompts, K = 7, temperature 0: 12208 accepted over 4816 drafts, AL 3.53",
    "chat figures for the same pair range 2.77 (K = 7, temperature 1, nebius/EAGLE3-Llama-3.3-"
    "70B-Instruct model card) to 3.53")
# Code and math: the chat tau above with (tau - 1) scaled by the same checkpoint's measured
# HumanEval / GSM8K over MT-Bench ratio at K = 7, temperature 1 (nebius model card table:
# MT-Bench 2.77, HumanEval 3.49, GSM8K 3.34): 1 + 2.53 x 2.49 / 1.77 and 1 + 2.53 x 2.34 / 1.77.
_EAGLE3_CODE = Acceptance(7, round(1 + 2.53 * 2.49 / 1.77, 2), _EAGLE3_CHAT.source + "; scaled "
                          "by HumanEval/MT-Bench (nebius/EAGLE3-Llama-3.3-70B-Instruct card)",
                          "3.49 at temperature 1 to 4.56")
_EAGLE3_MATH = Acceptance(7, round(1 + 2.53 * 2.34 / 1.77, 2), _EAGLE3_CHAT.source + "; scaled "
                          "by GSM8K/MT-Bench (nebius/EAGLE3-Llama-3.3-70B-Instruct card)",
                          "3.34 at temperature 1 to 4.34")
_EAGLE_CHAT = Acceptance(
    2, 1.89, "vLLM PR 16035: Llama-3-8B-Instruct + lmsys/sglang-EAGLE-LLaMA3-Instruct-8B, "
    "MT-Bench, K = 2, AL 1.89 (K = 4: 2.08; this alpha gives 2.18, +5%)",
    "1.89-2.08 for K = 2-4")
_MTP = Acceptance(
    1, 1.875, "DeepSeek-V3 technical report (arXiv:2412.19437) sec. 5.4.3: the second token's "
    "acceptance rate is 85-90% across generation topics; midpoint", "1.85-1.90")
_NGRAM_EDIT = Acceptance(
    5, 2.96, "vLLM PR 24344: n-gram, K = 5, prompt_lookup 2-5, vdaita/edit_5k_char (editing "
    "code whose text is in the prompt): sequence-normalised AL 2.96", "2.96 (4.59 when a match "
    "is found)")

ACCEPTANCE: dict[tuple[str, str], Acceptance] = {
    ("eagle3", "chat"): _EAGLE3_CHAT, ("eagle3", "code"): _EAGLE3_CODE,
    ("eagle3", "math"): _EAGLE3_MATH, ("eagle3", "summarisation"): _EAGLE3_CHAT,
    ("eagle", "chat"): _EAGLE_CHAT, ("eagle", "code"): _EAGLE_CHAT,
    ("eagle", "math"): _EAGLE_CHAT, ("eagle", "summarisation"): _EAGLE_CHAT,
    ("mtp", "chat"): _MTP, ("mtp", "code"): _MTP, ("mtp", "math"): _MTP,
    ("mtp", "summarisation"): _MTP,
    ("ngram", "code"): _NGRAM_EDIT, ("ngram", "summarisation"): _NGRAM_EDIT,
}
"""Defaults per (method, workload kind). Summarisation takes chat's for EAGLE-3 and EAGLE and
code's for n-gram (no per-task chain measurement found for them; stated in docs/features.md).
Missing entries (n-gram chat/math, a draft model) have no published default: the user passes
--acceptance-length."""


def solve_alpha(accept_len: float, spec_tokens: int) -> float:
    """Per-position acceptance alpha with (1 - a^(K+1)) / (1 - a) = tau (bisection; exact to
    1e-12). tau = K + 1 gives 1; tau = 1 gives 0."""
    k = int(spec_tokens)
    if not 1 <= accept_len <= k + 1:
        raise InputError(f"acceptance length {accept_len}: must be in [1, {k + 1}] for "
                         f"{k} draft tokens")
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if chain_accept_len(mid, k) < accept_len:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def chain_accept_len(alpha: float, spec_tokens: int) -> float:
    """Tokens emitted per step by a chain of K drafts with per-position acceptance alpha:
    1 + alpha + ... + alpha^K (the bonus token is always emitted; Leviathan et al. 2023)."""
    return float(sum(alpha ** i for i in range(int(spec_tokens) + 1)))


@dataclass(frozen=True)
class SpecPlan:
    """A resolved speculative configuration: what the memory and step models read."""

    method: str
    num_steps: int
    """Drafter forward passes per step (chain: K; MTP: K; n-gram: 0 GPU passes)."""
    topk: int
    verify_tokens: int
    """Tokens per sequence in the verification pass (chain K + 1; tree num_draft_tokens)."""
    accept_len: float
    accept_source: str
    draft_params: float
    """Drafter parameters read per draft pass (all GPUs of the TP group together)."""
    resident_params: float
    """Drafter parameters held in GPU memory (MTP: a whole layer with all its experts)."""
    draft_flops_per_token: float
    draft_kv_layers: float
    """Layers of KV the drafter keeps per token (EAGLE head: 1; MTP: its layers; draft model:
    all of its layers), in units of the target's KV bytes per token per layer."""
    draft_layers: int
    """Kernels' worth of decoder layers per draft pass (per-layer fixed cost)."""
    draft_model: Any = None

    @property
    def spec_tokens(self) -> int:
        return self.verify_tokens - 1


def parse_method(text: str) -> tuple[str, str | None]:
    """'eagle3' -> ('eagle3', None); 'draft:llama-3.2-1b' -> ('draft', 'llama-3.2-1b')."""
    raw = str(text).strip()
    key, _, arg = raw.partition(":")
    key = key.lower().replace("-", "").replace("_", "")
    aliases = {"eagle3": "eagle3", "eagle": "eagle", "eagle2": "eagle", "mtp": "mtp",
               "ngram": "ngram", "draft": "draft", "draftmodel": "draft"}
    if key not in aliases:
        raise InputError(f"--speculative {raw!r}: expected one of eagle3, eagle, mtp, ngram, "
                         "draft:MODEL")
    method = aliases[key]
    if method == "draft" and not arg:
        raise InputError("--speculative draft needs a model: draft:MODEL (a catalog key)")
    if method != "draft" and arg:
        raise InputError(f"--speculative {raw!r}: only draft takes a model (draft:MODEL)")
    return method, (arg or None)


def default_accept_len(method: str, kind: str, spec_tokens: int) -> tuple[float, str]:
    """(tau, source) for a chain of `spec_tokens` drafts from the published alpha."""
    if kind not in WORKLOAD_KINDS:
        raise InputError(f"workload kind {kind!r}: expected one of {', '.join(WORKLOAD_KINDS)}")
    acc = ACCEPTANCE.get((method, kind))
    if acc is None:
        raise InputError(f"--speculative {method}: no published acceptance length for {kind} "
                         "workloads; give the measured one in --acceptance-length (a server "
                         "reports it as 1 + accepted / drafts)")
    tau = chain_accept_len(acc.alpha, spec_tokens)
    return tau, f"{acc.source} (alpha {acc.alpha:.3f}; spread {acc.spread})"


def _eagle_head(model: Any, eagle3: bool) -> tuple[float, int]:
    """Parameters of an EAGLE / EAGLE-3 head for a target and its kernel layers.

    One decoder layer of the target's shape; EAGLE-3's attention takes [embedding, hidden]
    (2h inputs to q, k, v) after an fc fusing three target layers' states (3h -> h), and predicts
    over a 32k draft vocabulary; EAGLE-1/2's fc maps 2h -> h and it reads the target's LM head
    (vLLM model_executor/models/llama_eagle3.py and llama_eagle.py, v0.10). The embedding is
    shared with the target (vLLM loads it from the target when shapes agree).
    """
    h, hd = model.hidden_size, model.head_dim
    q, kv = model.num_attention_heads * hd, model.num_kv_heads * hd
    mlp = (3 if model.mlp_gated else 2) * h * model.intermediate_size
    inp = 2 * h if eagle3 else h
    attn = inp * (q + 2 * kv) + q * h
    fc = (3 if eagle3 else 2) * h * h
    head = (min(EAGLE3_DRAFT_VOCAB, model.vocab_size) if eagle3 else model.vocab_size) * h
    return attn + mlp + fc + head, 1


def _mtp_layer(model: Any, resident: bool) -> float:
    """Parameters of one MTP module: one decoder layer of the target, eh_proj (2h -> h) and
    the shared LM head (DeepSeek-V3 report sec. 2.2; vLLM deepseek_mtp.py). `resident`: what
    it holds in memory (a whole layer, every expert; the head is the target's); else what one
    pass reads (the layer's active parameters and the head)."""
    h = model.hidden_size
    params = model.params_total if resident else model.params_active
    body = (params - 2 * model.vocab_size * h) / model.num_layers
    return body + 2 * h * h + (0.0 if resident else model.vocab_size * h)


NOT_NEEDED = "not needed for memory"
"""The acceptance source of a memory answer, which asks for no acceptance length."""


def _accept_len(method: str, settings: Any, k: int, topk: int, verify: int,
                measured: float | None, needed: bool) -> tuple[float, str]:
    """(tau, source): the settings' value, else a calibration's, else the published default."""
    if settings.acceptance_length is not None or measured is not None:
        tau, src = ((float(settings.acceptance_length), "given (--acceptance-length)")
                    if settings.acceptance_length is not None else
                    (float(measured), "measured (calibration spec_acceptance_length)"))
        if not (math.isfinite(tau) and 1 <= tau <= verify):
            raise InputError(f"--acceptance-length {tau}: must be in [1, {verify}] (at most "
                             "the verified tokens per step)")
        return tau, src
    if not needed:
        return 1.0, NOT_NEEDED
    tau, src = default_accept_len(method, settings.spec_workload, k)
    return tau, src + ("; a chain's value for a tree (a lower bound)" if topk > 1 else "")


def _drafter(method: str, model: Any, draft: Any) -> tuple[float, float, int, float]:
    """(parameters read per pass, parameters resident, kernel layers, KV layers)."""
    if method in ("eagle3", "eagle"):
        params, layers = _eagle_head(model, method == "eagle3")
        return params, params, layers, 1.0
    if method == "mtp":
        if not getattr(model, "mtp_layers", 0):
            raise InputError(f"--speculative mtp: {model.key} has no multi-token-prediction "
                             "layer (config num_nextn_predict_layers is 0)")
        return _mtp_layer(model, resident=False), _mtp_layer(model, resident=True), 1, 1.0
    if method == "ngram":
        return 0.0, 0.0, 0, 0.0
    if draft is None:
        raise InputError("--speculative draft:MODEL: the draft model was not resolved")
    if draft.vocab_size != model.vocab_size:
        raise InputError(f"draft model {draft.key}: vocabulary {draft.vocab_size} differs "
                         f"from {model.key}'s {model.vocab_size} (the engines require one)")
    return (draft.params_total, draft.params_total, draft.num_layers,
            draft_kv_layers(model, draft))


def plan_speculation(model: Any, settings: Any, measured_accept_len: float | None = None,
                     need_accept_len: bool = True) -> SpecPlan | None:
    """The SpecPlan of engine settings (None without speculation or with 0 draft tokens).

    Settings fields read: speculative, spec_tokens, spec_topk, spec_draft_tokens,
    acceptance_length, spec_workload, and draft_model (a ModelSpec for draft:MODEL).
    `measured_accept_len` (a calibration's) replaces the published default; the settings'
    acceptance_length replaces both. need_accept_len False (memory only) skips the acceptance
    length (tau 1 when no source gives it).
    """
    if not getattr(settings, "speculative", None):
        return None
    method, _ = parse_method(settings.speculative)
    k = settings.spec_tokens if settings.spec_tokens is not None else DEFAULT_SPEC_TOKENS[method]
    if not isinstance(k, int) or k < 0:
        raise InputError(f"--spec-tokens {k}: must be an integer >= 0")
    if k == 0:
        return None  # K = 0 is plain decoding, exactly
    topk = int(settings.spec_topk or 1)
    verify = int(settings.spec_draft_tokens or (k * topk if topk > 1 else k) + 1)
    if topk < 1 or verify < 2 or verify > k * topk + 1:
        raise InputError(f"--spec-draft-tokens {verify}: must be in [2, {k * topk + 1}] for "
                         f"{k} steps of top-{topk}")
    tau, src = _accept_len(method, settings, k, topk, verify, measured_accept_len,
                           need_accept_len)
    draft = getattr(settings, "draft_model", None)
    params, resident, layers, kv_layers = _drafter(method, model, draft)
    return SpecPlan(method=method, num_steps=k if method != "ngram" else 0, topk=topk,
                    verify_tokens=verify, accept_len=tau, accept_source=src,
                    draft_params=params, draft_flops_per_token=2 * params,
                    resident_params=resident, draft_kv_layers=kv_layers, draft_layers=layers,
                    draft_model=draft)


def draft_kv_layers(model: Any, draft: Any) -> float:
    """A draft model's KV per token in units of the target's per-layer KV (no TP split here)."""
    per_layer_target = 2 * model.num_kv_heads * model.head_dim
    return draft.num_layers * 2 * draft.num_kv_heads * draft.head_dim / per_layer_target
