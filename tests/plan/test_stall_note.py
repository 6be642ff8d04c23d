"""The note `latency` adds when prompt work stalls the decodes (plan/replay.stall_note): it
names the engine option that removes the stall, and following it does."""

from __future__ import annotations

import capplan

KW = dict(input_len=2048, output_len=512, rate=3, tp=4)


def _note(res: dict) -> str:
    return next((n for n in res["notes"] if "x its median" in n), "")


def test_sglang_prefill_first_names_mixed_chunk() -> None:
    res = capplan.latency("llama-3.1-70b", "h200", engine="sglang", **KW).data
    assert "stops the running decodes" in _note(res)
    assert "--engine sglang+mixed-chunk" in _note(res)


def test_tensorrt_llm_whole_prompts_name_chunking_below_the_prompts() -> None:
    # TensorRT-LLM runs each 2,048-token prompt whole beside the decodes (TBT p99 8x its
    # median). Chunked prefill alone keeps the 8,192-token budget, which holds the prompt
    # whole: the same TBT; with a budget below the prompts (512) the stall splits over steps.
    base = capplan.latency("llama-3.1-70b", "h200", engine="trtllm", **KW).data
    note = _note(base)
    assert "runs each prompt whole" in note and "(now 8192)" in note
    assert "--engine trtllm+chunked-prefill --max-num-batched-tokens N" in note
    same = capplan.latency("llama-3.1-70b", "h200", engine="trtllm+chunked-prefill", **KW).data
    assert same["tbt_s"]["p99"] >= 0.95 * base["tbt_s"]["p99"]
    # with the option on, the note keeps the half of the advice not yet followed
    assert "up to 8192 prompt tokens" in _note(same) and "--max-num-batched-tokens N" in _note(same)
    split = capplan.latency("llama-3.1-70b", "h200", engine="trtllm+chunked-prefill",
                            max_num_batched_tokens=512, max_num_seqs=256, **KW).data
    assert split["tbt_s"]["p99"] < 0.5 * base["tbt_s"]["p99"]
    assert not _note(split)


def test_vllm_chunks_name_the_token_budget() -> None:
    """vLLM already mixes chunks with the decodes; its 8,192-token budget holds a 2,048-token
    prompt whole (TBT p99 7x its median): the note names the budget, and a smaller one (512)
    brings the tail under 3x its median (no note)."""
    base = capplan.latency("llama-3.1-70b", "h200", engine="vllm", **KW).data
    assert "up to 8192 prompt tokens beside the running decodes" in _note(base)
    small = capplan.latency("llama-3.1-70b", "h200", engine="vllm", max_num_batched_tokens=512,
                            max_num_seqs=256, **KW).data
    assert small["tbt_s"]["p99"] < 0.5 * base["tbt_s"]["p99"] and not _note(small)
