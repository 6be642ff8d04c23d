"""Per-layer KV cache and recurrent-state arithmetic: one spec per layer kind.

Each layer kind maps to the vLLM V1 KV cache spec that allocates its memory
(vllm/v1/kv_cache_interface.py, vLLM 0.10-0.11):

    full_attention     FullAttentionSpec    2 * kv_heads * head_dim * dtype per token
    (MLA)              MLAAttentionSpec     (kv_lora_rank + qk_rope_head_dim) * dtype per token
    sliding_attention  SlidingWindowSpec    per token, but only the last window - 1 tokens kept
    chunked_attention  ChunkedLocalAttentionSpec   per token, the current chunk kept
    mamba, mamba2      MambaSpec            conv + SSM state, fixed per sequence
    linear_attention   MambaSpec            gated-DeltaNet conv + recurrent state, fixed
    short_conv         MambaSpec            conv state, fixed per sequence

State shapes per GPU are those of vllm/model_executor/layers/mamba/mamba_utils.py
(MambaStateShapeCalculator). Hybrid models share one block pool: vLLM's
HybridAttentionMambaModelConfig (vllm/model_executor/models/config.py) raises the attention
block size to 16 * cdiv(state_page, 16 * attention_page_per_token) tokens so an attention page
holds a state page, and pads the state page to the attention page; layers are split into
groups of equal size (kv_cache_utils, the last group of a type padded) and each sequence then
holds one block per recurrent group (mamba_cache_mode "none": MambaSpec.max_memory_usage_bytes)
and ceil(L / block_size) blocks per attention group; state_blocks_per_seq is that state in the
simulator's block unit. Derivations: docs/architectures.md.

Pure functions of a ModelSpec and numbers.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any

import numpy as np

from capplan.catalog.schema import ATTENTION_KINDS, RECURRENT_KINDS, ModelSpec
from capplan.models.memo import per_model
from capplan.units import DTYPE_BYTES, cdiv

WINDOW_KINDS = ("sliding_attention", "chunked_attention")


@dataclass(frozen=True)
class StageLayers:
    """Mixer and MLP kinds of the layers on the heaviest pipeline stage."""

    mixers: tuple[str, ...]
    mlps: tuple[str, ...]
    mlp_widths: tuple[int, ...] = ()
    """Per-layer dense MLP widths, when the model lists them."""

    @cached_property
    def _mixer_counts(self) -> Counter:
        return Counter(self.mixers)

    def count(self, *kinds: str) -> int:
        return sum(self._mixer_counts[k] for k in set(kinds))

    @property
    def num_moe(self) -> int:
        return sum(k == "moe" for k in self.mlps)

    @property
    def num_dense_mlp(self) -> int:
        return sum(k == "dense" for k in self.mlps)


def stage_layers(model: ModelSpec, pp: int = 1) -> StageLayers:
    """Layers of the heaviest of pp contiguous stages (vLLM splits layers evenly); memoised
    per model object and pp (models/memo.py).
    """
    return _stage_layers(model, int(pp))


@per_model
def _stage_layers(model: ModelSpec, pp: int) -> StageLayers:
    """stage_layers, computed.

    Without per-layer types the stage holds cdiv(L, pp) layers and a proportional share of the
    sliding and MoE layers, rounded up (the worst stage).
    """
    n = model.num_layers
    per = cdiv(n, pp)
    if model.layer_types is None and model.mlp_types is None:
        win = math.ceil(model.num_sliding_layers * per / n)
        moe = min(per, math.ceil(model.num_moe_layers / pp)) if model.num_moe_layers else 0
        return StageLayers(("full_attention",) * (per - win) + ("sliding_attention",) * win,
                           ("dense",) * (per - moe) + ("moe",) * moe)
    mixers, mlps = model.layer_kinds, model.mlp_kinds
    widths = model.mlp_intermediate_sizes or []
    stages = [StageLayers(tuple(mixers[i:i + per]), tuple(mlps[i:i + per]),
                          tuple(widths[i:i + per])) for i in range(0, n, per)]
    return max(stages, key=lambda s: (len(s.mixers), s.count(*ATTENTION_KINDS), s.num_moe))


# ---------------------------------------------------------------------------------------------
# KV bytes per token (attention kinds)
# ---------------------------------------------------------------------------------------------


def kv_heads_per_gpu(model: ModelSpec, tp: int) -> float:
    """KV heads each GPU stores: max(1, kv_heads / tp); heads replicate when tp exceeds them."""
    return max(1.0, model.num_kv_heads / tp)


def attention_kv_bytes_per_token(model: ModelSpec, tp: int, kv_bytes: float) -> float:
    """KV bytes one token occupies in one attention layer on one GPU.

    GQA/MQA/MHA: 2 (K and V) * kv_heads_per_gpu * head_dim * dtype (FullAttentionSpec).
    MLA: kv_lora_rank + qk_rope_head_dim, stored once per token and replicated on every TP rank
    (MLAAttentionSpec; DeepSeek-V2 paper eq. 9-10); an fp8 cache takes the model's
    `mla.fp8_latent_bytes` where the catalog gives one (DeepSeek-V3.2's fp8_ds_mla, 656 B).
    """
    if model.mla is not None:
        m = model.mla
        latent = (m.kv_lora_rank + m.qk_rope_head_dim) * kv_bytes
        if kv_bytes == DTYPE_BYTES["fp8"] and m.fp8_latent_bytes:
            latent = m.fp8_latent_bytes  # the catalog's fp8 layout (model_catalog source)
        return latent + indexer_bytes_per_token(model)
    return 2 * kv_heads_per_gpu(model, tp) * model.head_dim * kv_bytes


def indexer_bytes_per_token(model: ModelSpec) -> float:
    """DeepSeek-V3.2's lightning-indexer key cache, per token per layer: fp8 values plus one
    fp32 scale per 128 (index_head_dim + index_head_dim // 128 * 4 = 132 B), a second
    MLAAttentionSpec beside the latent (vLLM DeepseekV32IndexerCache)."""
    m = model.mla
    if m is None or not m.index_head_dim:
        return 0.0
    return float(m.index_head_dim + m.index_head_dim // 128 * 4)


def kv_bytes_per_token(model: ModelSpec, tp: int, kv_bytes: float, pp: int = 1) -> float:
    """KV bytes per token over the attention layers of the heaviest stage (sliding ones counted
    as if full: the unit of vLLM's "GPU KV cache size: N tokens"); recurrent layers add none."""
    st = stage_layers(model, pp)
    return st.count(*ATTENTION_KINDS) * attention_kv_bytes_per_token(model, tp, kv_bytes)


# ---------------------------------------------------------------------------------------------
# Recurrent state bytes per sequence
# ---------------------------------------------------------------------------------------------


def state_dtype_bytes(model: ModelSpec) -> tuple[float, float]:
    """(conv state, SSM/recurrent state) bytes per element.

    The conv state is in the model dtype (mamba_cache_dtype auto); the SSM state in
    mamba_ssm_cache_dtype, which the checkpoint's config may set (MambaStateDtypeCalculator).
    """
    conv = DTYPE_BYTES["bf16"] if model.torch_dtype == "fp32" else model.dtype_bytes
    ssm = DTYPE_BYTES[model.ssm_state_dtype] if model.ssm_state_dtype else conv
    return conv, ssm


def recurrent_state_bytes(model: ModelSpec, kind: str, tp: int) -> float:
    """Fixed state one sequence holds in one recurrent layer on one GPU (MambaSpec page).

    mamba2: conv (k-1) x (inner + 2 g' n) / tp, SSM (heads / tp) x head_dim x n, where g' is
        the groups raised to tp when tp does not divide them (extra_groups_for_head_shards)
    mamba (v1): conv (k-1) x inner / tp, SSM inner / tp x n
    linear_attention (gated DeltaNet): conv (k-1) x (2 k_heads dk + v_heads dv) / tp,
        recurrent (v_heads / tp) x dv x dk
    short_conv (LFM2): conv (k-1) x hidden / tp
    """
    conv_b, ssm_b = state_dtype_bytes(model)
    if kind in ("mamba", "mamba2"):
        s = model.ssm
        assert s is not None, "mamba layers need ssm"
        if s.version == 1:
            return (s.conv_kernel - 1) * s.inner_size / tp * conv_b + (
                s.inner_size / tp * s.state_size * ssm_b)
        groups = s.n_groups if s.n_groups % tp == 0 else s.n_groups + tp - s.n_groups
        conv_dim = s.inner_size + 2 * groups * s.state_size
        return ((s.conv_kernel - 1) * conv_dim / tp * conv_b
                + s.num_heads / tp * s.head_dim * s.state_size * ssm_b)
    if kind == "linear_attention":
        la = model.linear_attention
        assert la is not None, "linear_attention layers need linear_attention"
        conv_dim = 2 * la.num_k_heads * la.head_k_dim + la.num_v_heads * la.head_v_dim
        return ((la.conv_kernel - 1) * conv_dim / tp * conv_b
                + la.num_v_heads / tp * la.head_v_dim * la.head_k_dim * ssm_b)
    if kind == "short_conv":
        assert model.conv_kernel is not None
        return (model.conv_kernel - 1) * model.hidden_size / tp * conv_b
    return 0.0


def state_page_bytes(model: ModelSpec, tp: int) -> float:
    """The largest recurrent state page of the model's layers (vLLM uses one page size)."""
    kinds = {k for k in model.layer_kinds if k in RECURRENT_KINDS}
    return max((recurrent_state_bytes(model, k, tp) for k in kinds), default=0.0)


def effective_block_size(model: ModelSpec, tp: int, kv_bytes: float, block_size: int) -> int:
    """Attention block size vLLM uses: a hybrid raises it until one attention page holds a state
    page, in multiples of 16 (HybridAttentionMambaModelConfig.verify_and_update_config)."""
    page = state_page_bytes(model, tp)
    per_token = attention_kv_bytes_per_token(model, tp, kv_bytes)
    if page == 0 or not any(k in ATTENTION_KINDS for k in model.layer_kinds):
        return block_size
    return max(block_size, 16 * cdiv(math.ceil(page), 16 * math.ceil(per_token)))


# vLLM v0.11 vllm/v1/core/kv_cache_utils.py _get_kv_cache_groups_uniform_page_size: a group's
# size is the fewest layers of any spec type, or the most when that is < 1.25 x the fewest
# (v0.10.0 took the fewest always; later releases raised 1.25 to 1.5).
GROUP_BALANCE = 1.25


def kv_cache_group_size(layers_per_type: list[int]) -> int:
    """Layers per KV cache group when a model mixes spec types (vLLM V1 hybrid allocator)."""
    lo, hi = min(layers_per_type), max(layers_per_type)
    return hi if hi < lo * GROUP_BALANCE else lo


def state_pages_per_seq(model: ModelSpec, pp: int = 1) -> int:
    """Recurrent state pages one sequence holds on the heaviest stage, group padding included.

    vLLM V1 splits each spec type's layers into groups of `kv_cache_group_size` (the last one
    padded) and a running sequence holds one pool block per recurrent group (MambaManager,
    mamba_cache_mode "none"), a block being one page in each of the group's slots: Nemotron-H's
    54 Mamba2 layers over 10 attention layers make 6 groups, 60 pages. Without attention
    layers the state is one page per layer (no groups to pad).
    """
    st = stage_layers(model, pp)
    rec = [st.count(k) for k in RECURRENT_KINDS if st.count(k)]
    attn = [st.count(k) for k in ATTENTION_KINDS if st.count(k)]
    if not rec or not attn:
        return sum(rec)
    g = kv_cache_group_size(attn + rec)
    return sum(cdiv(n, g) for n in rec) * g


def state_blocks_per_seq(model: ModelSpec, pp: int = 1) -> int:
    """Blocks of the KV pool one running sequence's recurrent state holds, from admission to
    finish or preemption, in the unit of `memory_report`'s num_gpu_blocks (one block =
    block_size tokens in every attention layer of the stage).

    Whole pool blocks: the state pages over the attention layers a block spans, rounded up
    (exact when the attention layers form one group, as in every hybrid of the catalog:
    Qwen3-Next 36 / 12 = 3, Nemotron-H-56B 60 / 10 = 6). 0 without attention layers (the
    state is then the sequence's only block) or without recurrent layers.
    """
    n_attn = stage_layers(model, pp).count(*ATTENTION_KINDS)
    return cdiv(state_pages_per_seq(model, pp), n_attn) if n_attn else 0


def state_bytes_per_seq(model: ModelSpec, tp: int, kv_bytes: float, block_size: int,
                        pp: int = 1) -> float:
    """Memory one sequence's recurrent state holds on the heaviest stage, in padded pages.

    With attention layers each state page is padded to block_size * attention bytes per token
    (block_size from effective_block_size) and groups are padded (state_pages_per_seq); a pure
    recurrent model keeps the raw page.
    """
    pages = state_pages_per_seq(model, pp)
    if not pages:
        return 0.0
    page = state_page_bytes(model, tp)
    if any(k in ATTENTION_KINDS for k in model.layer_kinds):
        page = max(page, block_size * attention_kv_bytes_per_token(model, tp, kv_bytes))
    return pages * page


def window_blocks_cap(window: int, block_size: int, max_num_batched_tokens: int) -> int:
    """The most blocks one sequence holds in a sliding-window layer: the window behind a
    prefill chunk of up to max_num_batched_tokens tokens, plus one for a window that straddles
    block edges; older blocks are freed as the sequence grows (vLLM V1
    `SlidingWindowSpec.max_memory_usage_bytes`, `SlidingWindowManager.remove_skipped_blocks`)."""
    return cdiv(window - 1 + max_num_batched_tokens, block_size) + 1


NO_CAP = 1 << 40
"""BlockLayout.window_cap of a layout without window layers (no token count reaches it)."""


def window_blocks(token_blocks: Any, cap: Any) -> Any:
    """Blocks one sliding-window layer holds for a sequence of `token_blocks` blocks of tokens
    (the one rule of the replay, `speed` and the analytic models): min(token_blocks, cap), 0
    for no tokens; cap from `window_blocks_cap`. Numbers in, a number out; arrays (the
    analytic models' rows, a mean's fractional blocks) element by element."""
    # vLLM V1 allocates cdiv(L, bs) blocks (get_num_blocks_to_allocate) and frees only those
    # wholly behind the window (get_num_skipped_tokens), so at most the cap once it slides
    held = np.minimum(np.maximum(np.asarray(token_blocks), 0), cap)
    return held if held.ndim else held.item()


@dataclass(frozen=True)
class BlockLayout:
    """How a sequence's token blocks fill the KV pool, in the simulator's block unit: block_size
    tokens in gcd(full, window) attention layers of the stage (for a model without window
    layers, all of them: the unit of `memory_report`'s num_gpu_blocks, `units` = 1).

    A sequence of k token blocks holds `blocks(k)` = full * k + window * window_blocks(k,
    window_cap) pool blocks (vLLM V1's hybrid KV cache manager: full-attention groups grow with
    the sequence, sliding-window groups keep at most `window_blocks_cap` blocks).

    A prefix-cache entry (one cached token block) holds `entry` pool blocks: its full-layer
    blocks; in a layout of window layers only, its window-layer blocks, and a sequence caches
    at most `cached_cap` token blocks (the window blocks it holds at once; vLLM's
    `SlidingWindowManager.find_longest_cache_hit` needs only the cdiv(window - 1, bs) blocks
    before the hit cached and holds only those, so a longer cached prefix is reused here up to
    `cached_cap` blocks and the rest recomputed)."""

    full: int = 1
    """Pool blocks per token block in the full-attention layers."""
    window: int = 0
    """The same in the window layers, up to `window_cap` token blocks."""
    window_cap: int = NO_CAP
    sliding_window: int = 0
    """The window (tokens) behind window_cap; 0 without window layers."""

    def __post_init__(self) -> None:
        # window layers without their cap would hold every token block (window_blocks has no
        # uncapped case): a layout that keeps them whole is `kept_whole`
        if not self.has_window:
            return
        if np.any((np.asarray(self.window) > 0) & (np.asarray(self.window_cap) >= NO_CAP)):
            raise ValueError("a BlockLayout with window layers needs their window_cap "
                             "(window_blocks_cap)")

    @property
    def has_window(self) -> bool:
        """Whether the layout holds window layers (in any row, for a layout of arrays)."""
        return bool(np.any(np.asarray(self.window) > 0))

    @property
    def _scalar_dense(self) -> bool:
        """No window layers in a layout of numbers: a sequence holds its tokens as they are
        (the fast path; a layout of arrays goes element by element even where all are dense)."""
        return isinstance(self.window, int) and not self.has_window

    def for_budget(self, block_size: int, max_num_batched_tokens: int) -> BlockLayout:
        """The layout under another token budget (the cap follows max_num_batched_tokens)."""
        if not self.has_window:
            return self
        return replace(self, window_cap=window_blocks_cap(self.sliding_window, block_size,
                                                          max_num_batched_tokens))

    @property
    def units(self) -> int:
        """Simulator blocks per block of `memory_report`'s num_gpu_blocks."""
        return self.full + self.window

    def sim_blocks(self, memory_blocks: int) -> int:
        """`memory_blocks` blocks of `memory_report`'s num_gpu_blocks (all layers) in the
        simulator's block unit (gcd(full, window) layers): `units` each."""
        return int(memory_blocks) * self.units

    def kept_whole(self) -> BlockLayout:
        """The layout under an engine that keeps its window layers' out-of-window blocks
        (SchedulerPolicy.frees_out_of_window False): window layers count as full ones, for the
        blocks a sequence holds and a prefix-cache entry's, in the same block unit."""
        return BlockLayout(self.units) if self.has_window else self

    def blocks(self, token_blocks: Any) -> Any:
        """Pool blocks of a sequence holding `token_blocks` blocks of tokens (element by
        element for arrays: a layout whose fields are the analytic models' rows)."""
        if self._scalar_dense:
            return self.full * token_blocks
        return self.full * token_blocks + self.window * window_blocks(token_blocks,
                                                                      self.window_cap)

    def kv_tokens(self, tokens: Any, block_size: Any) -> Any:
        """KV capacity a sequence of `tokens` tokens holds, in the tokens `memory_report`'s
        kv_cache_tokens counts (a token in every attention layer of the stage): block_size x
        `blocks`(tokens / block_size) / `units`, window layers capped by `window_blocks`;
        `tokens` itself without window layers. Fractional token blocks (a mean length, its
        last block's rounding counted apart) are taken as they are."""
        if self._scalar_dense:
            return tokens
        bs = np.asarray(block_size, float)
        return bs * self.blocks(np.asarray(tokens, float) / bs) / self.units

    def cached_kv_tokens(self, tokens: Any, block_size: Any) -> Any:
        """KV capacity (kv_cache_tokens' unit) a cached prefix of `tokens` tokens holds once for
        all its holders: `entry` pool blocks per token block, its first `cached_cap` token
        blocks at most, over `units` (the replay's prefix-cache entries: window layers' blocks
        are each sequence's own unless the layout has no full layers); `tokens` itself without
        window layers. Element by element for arrays, as `kv_tokens`."""
        if self._scalar_dense:
            return tokens
        bs = np.asarray(block_size, float)
        return (bs * self.entry * np.minimum(np.asarray(tokens, float) / bs, self.cached_cap)
                / self.units)

    @property
    def entry(self) -> Any:
        """Pool blocks one prefix-cache entry (a cached token block) holds: the full layers',
        the window layers' in a layout without full layers (never 0). Element by element for
        a layout of arrays."""
        full = np.asarray(self.full)
        out = np.where(full > 0, full, self.window)
        return out if out.ndim else out.item()

    @property
    def cached_cap(self) -> Any:
        """Token blocks of a sequence that can be prefix-cache entries: all with full layers,
        the window blocks held at once (`window_cap`) without. Element by element for a
        layout of arrays."""
        out = np.where(np.asarray(self.full) > 0, NO_CAP, self.window_cap)
        return out if out.ndim else out.item()

    def token_blocks_within(self, pool_blocks: int, most: int) -> int:
        """The most token blocks, up to `most`, whose `blocks` fit `pool_blocks` (blocks grows
        with the token blocks)."""
        lo, hi = 0, max(most, 0)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.blocks(mid) <= pool_blocks:
                lo = mid
            else:
                hi = mid - 1
        return lo


DENSE_LAYOUT = BlockLayout()


def stack_layouts(rows: list[list[BlockLayout]]) -> BlockLayout:
    """One layout whose fields are arrays of shape (rows, columns) (a column broadcast over
    a row), for the analytic models' configuration rows; DENSE_LAYOUT when none has window
    layers (BlockLayout.blocks and kv_tokens take the fields element by element)."""
    if not any(lay.has_window for row in rows for lay in row):
        return DENSE_LAYOUT

    def field(name: str) -> np.ndarray:
        return np.asarray([[getattr(lay, name) for lay in row] for row in rows], np.int64)

    return BlockLayout(field("full"), field("window"), field("window_cap"),
                       field("sliding_window"))


def block_layout(model: ModelSpec, block_size: int, max_num_batched_tokens: int, pp: int = 1,
                 frees_out_of_window: bool = True) -> BlockLayout:
    """The simulator's block layout of `model` on its heaviest stage: window layers capped at
    `window_blocks_cap` (the cap `sequence_bytes` sizes `memory`'s max concurrency with), or
    counted as full layers when the engine keeps out-of-window blocks
    (`frees_out_of_window` False; SchedulerPolicy.frees_out_of_window, BlockLayout.kept_whole)."""
    st = stage_layers(model, pp)
    full, win = st.count("full_attention"), st.count(*WINDOW_KINDS)
    if not (win and model.sliding_window):
        return DENSE_LAYOUT
    g = math.gcd(full, win)
    layout = BlockLayout(full // g, win // g, window_blocks_cap(
        model.sliding_window, block_size, max_num_batched_tokens), model.sliding_window)
    return layout if frees_out_of_window else layout.kept_whole()


def sequence_bytes(model: ModelSpec, seq_len: float, tp: int, kv_bytes: float,
                   block_size: int = 16, pp: int = 1,
                   max_num_batched_tokens: int | None = None) -> float:
    """KV and state bytes a sequence of seq_len tokens holds on one GPU, in whole blocks.

    Full-attention layers hold ceil(L / block_size) blocks. Sliding-window layers:
    - max_num_batched_tokens None: the steady decode footprint, min(ceil(L / bs),
      ceil((window - 1) / bs) + 1) blocks (blocks behind the window are freed);
    - else vLLM's reservation, ceil(min(window - 1 + max_num_batched_tokens, L) / bs) + 1
      blocks: a prefill chunk needs the window behind its first token
      (SlidingWindowSpec.max_memory_usage_bytes, the figure behind "Maximum concurrency" and
      vLLM's start-up check). It is `window_blocks`' cap from L = window - 1 + budget on;
      below, one block more than the ceil(L / bs) a sequence holds (`window_blocks`).
    Recurrent layers hold one (padded) state page whatever L is (MambaSpec).
    """
    st = stage_layers(model, pp)
    per_layer = attention_kv_bytes_per_token(model, tp, kv_bytes)
    full = st.count("full_attention")
    win_layers = st.count(*WINDOW_KINDS)
    full_blocks = math.ceil(seq_len / block_size)
    blocks = (full + win_layers) * full_blocks
    if win_layers and model.sliding_window:
        if max_num_batched_tokens is None:
            win = min(full_blocks, cdiv(model.sliding_window - 1, block_size) + 1)
        else:
            # vLLM's start-up reservation: cdiv(min(window - 1 + budget, L), bs) + 1 (its
            # straddling block even below the cap, where a sequence holds window_blocks)
            win = min(full_blocks, window_blocks_cap(
                model.sliding_window, block_size, max_num_batched_tokens) - 1) + 1
        blocks = full * full_blocks + win_layers * win
    return (blocks * block_size * per_layer
            + state_bytes_per_seq(model, tp, kv_bytes, block_size, pp))


# ---------------------------------------------------------------------------------------------
# Parameters per layer
# ---------------------------------------------------------------------------------------------


def mixer_params(model: ModelSpec, kind: str, tp: int) -> float:
    """Parameters of one layer's token mixer on one GPU (projections, convolutions, norms).

    Attention (GQA): q and o split by heads (q doubled with an output gate), k and v by KV
    heads, replicated when tp exceeds them (vLLM QKVParallelLinear). MLA (DeepSeek-V2 paper,
    sec. 2.1): q_a/kv_a replicated, q_b/kv_b/o split by heads.
    mamba2 (Mamba2 paper; HF NemotronH/Granite mixers): in_proj h x (2 inner + 2 g n + heads),
    conv1d (k + 1) x conv_dim (weights and bias), A, D, dt_bias per head, a gated norm of inner,
    out_proj inner x h. mamba (v1, Jamba): in_proj h x 2 inner, conv (k + 1) x inner, x_proj
    inner x (dt_rank + 2 n), dt_proj (dt_rank + 1) x inner, A inner x n, D inner, out inner x h.
    linear_attention (gated DeltaNet, HF Qwen3Next): in_proj_qkvz h x (2 key + 2 value),
    in_proj_ba h x 2 v_heads, conv k x (2 key + value), dt_bias and A per v head, norm dv,
    out_proj value x h. short_conv (HF Lfm2): in_proj h x 3h, conv k x h, out_proj h x h.
    """
    h = model.hidden_size
    if kind in ATTENTION_KINDS:
        return _attention_params(model, tp)
    if kind == "mamba2":
        s = model.ssm
        assert s is not None
        inner, gn = s.inner_size, 2 * s.n_groups * s.state_size
        conv_dim = inner + gn
        return (h * (2 * inner + gn + s.num_heads) + (s.conv_kernel + 1) * conv_dim
                + 3 * s.num_heads + inner + inner * h) / tp
    if kind == "mamba":
        s = model.ssm
        assert s is not None
        inner, r, n = s.inner_size, s.dt_rank or math.ceil(model.hidden_size / 16), s.state_size
        return (h * 2 * inner + (s.conv_kernel + 1) * inner + inner * (r + 2 * n)
                + (r + 1) * inner + inner * n + inner + inner * h) / tp
    if kind == "linear_attention":
        la = model.linear_attention
        assert la is not None
        key, value = la.num_k_heads * la.head_k_dim, la.num_v_heads * la.head_v_dim
        return (h * (2 * key + 2 * value) + h * 2 * la.num_v_heads
                + la.conv_kernel * (2 * key + value) + 2 * la.num_v_heads + la.head_v_dim * tp
                + value * h) / tp
    if kind == "short_conv":
        assert model.conv_kernel is not None
        return (3 * h * h + model.conv_kernel * h + h * h) / tp
    return 0.0


def _attention_params(model: ModelSpec, tp: int) -> float:
    h = model.hidden_size
    if model.mla is not None:
        m = model.mla
        qk = m.qk_nope_head_dim + m.qk_rope_head_dim
        heads = model.num_attention_heads / tp
        q = (h * m.q_lora_rank + m.q_lora_rank + m.q_lora_rank * heads * qk
             if m.q_lora_rank else h * heads * qk)
        kv_a = h * (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank
        kv_b = m.kv_lora_rank * heads * (m.qk_nope_head_dim + m.v_head_dim)
        o = heads * m.v_head_dim * h
        indexer = 0.0
        if m.index_head_dim and m.index_n_heads:  # wq_b, wk, k_norm, weights_proj (replicated)
            d, n = m.index_head_dim, m.index_n_heads
            indexer = (m.q_lora_rank or h) * n * d + h * d + 2 * d + h * n
        return q + kv_a + kv_b + o + indexer
    hd = model.head_dim
    q_o = (3 if model.attn_output_gate else 2) * h * model.num_attention_heads * hd / tp
    kv = 2 * h * kv_heads_per_gpu(model, tp) * hd
    return q_o + kv


def dense_mlp_params(model: ModelSpec, stage: StageLayers, tp: int) -> float:
    """Dense MLP parameters of a stage on one GPU: matrices x hidden x width / tp per dense
    layer, with per-layer widths when the model has them (DeciLM ffn_mult blocks)."""
    h, mats = model.hidden_size, mlp_matrices(model)
    if stage.mlp_widths:
        return sum(mats * h * w / tp for k, w in zip(stage.mlps, stage.mlp_widths, strict=True)
                   if k == "dense")
    return stage.num_dense_mlp * mats * h * model.intermediate_size / tp


def mlp_matrices(model: ModelSpec) -> int:
    """Weight matrices of one MLP: gate, up and down when gated (SwiGLU/GeGLU), else up, down."""
    return 3 if model.mlp_gated else 2
