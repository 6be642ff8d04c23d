"""A disaggregated prefill worker as its engine runs it: TensorRT-LLM's context servers run
without the overlap scheduler (examples/disaggregated/README.md: `disable_overlap_scheduler:
True`, "not yet supported in disaggregated context server architectures"), so the replay's
prefill pool forms each step when it starts, its host work adds to its steps, and its launch
line says so; the other engines' prefill workers keep their overlap, and an engine spec that
sets one is kept."""

from __future__ import annotations

import pytest
import yaml

from capplan.api import disaggregated
from capplan.plan.launch_multinode import pd_launch


def _layout(engine: str):
    return disaggregated("llama-3.1-8b", "h100-sxm", prefill_workers=1, decode_workers=1,
                         engine=engine, max_model_len=8192)


def _options(line: str) -> dict:
    """The LLM-API options a worker line reads (its file, after `#`)."""
    return yaml.safe_load(line.split("-config.yaml: ", 1)[1])


def test_trtllm_context_servers_run_without_overlap_and_say_so():
    lay = _layout("trtllm")
    assert not lay.prefill.profile.host_overlap
    assert not lay.prefill.profile.scheduler.schedules_ahead  # each step formed when it starts
    assert lay.decode.profile.host_overlap and lay.decode.profile.scheduler.schedules_ahead
    lines = pd_launch(lay)
    ctx, gen = _options(lines["context worker 0"][-1]), _options(lines["generation worker 0"][-1])
    assert ctx["disable_overlap_scheduler"] is True and "disable_overlap_scheduler" not in gen
    for opts in (ctx, gen):  # both transfer KV, a buffer for the longest prompt
        assert opts["cache_transceiver_config"]["max_tokens_in_buffer"] >= 8192 - 16


@pytest.mark.parametrize("engine", ["sglang", "vllm", "trtllm+overlap"])
def test_other_prefill_workers_keep_their_overlap(engine):
    lay = _layout(engine)
    assert lay.prefill.profile.host_overlap and lay.decode.profile.host_overlap

