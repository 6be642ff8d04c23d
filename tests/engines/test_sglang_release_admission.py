"""The `sglang@0.3` and `sglang@0.4` profiles' prefill admission, against the releases' sources.

SGLang 0.3.0 (python/sglang/srt/managers/policy_scheduler.py `PrefillAdder`, tp_worker.py
`ModelTpServer.get_new_prefill_batch` and `forward_step`, server_args.py `ServerArgs`) and
0.4.0-0.4.9 (schedule_policy.py `PrefillAdder`, scheduler.py `get_new_batch_prefill`) run the
rule the 0.5 profile replays (read from 0.5.8): a step with waiting prompts prefills only;
after its first prompt (a continuing chunk counts) a further one is refused when its tokens
exceed rem_input_tokens = max_prefill_tokens (16384) less the prompt tokens scheduled (less
the running decodes only with --enable-mixed-chunk), and a refusal ends the step
(`if not res ...: break`; 0.4: `res != AddReqResult.CONTINUE`); one admitted is chunked at
rem_chunk_tokens = chunked_prefill_size (8192) less the same. Through 0.4.6 the test is
`input_tokens > rem_input_tokens` (from 0.4.9 `>=`), a one-token difference not replayed.
"""

from __future__ import annotations

import numpy as np
import pytest

from capplan.catalog.loader import load_catalog
from capplan.models.engine import engine_profile
from capplan.sim import ContinuousEngine, Requests
from tests.sim.test_sglang_admission import Recorder


@pytest.mark.parametrize("spec", ["sglang@0.3", "sglang@0.4"])
def test_policy_fields_are_those_of_the_release(spec):
    pol = engine_profile(spec).scheduler
    # tp_worker.py forward_step (0.3.0), scheduler.py get_next_batch_to_run (0.4): a new
    # prefill batch runs instead of the decode batch; --enable-mixed-chunk off by default
    assert pol.prefill_first
    # server_args.py: chunked_prefill_size 8192 (0.3.0; 0.4 by GPU memory), <= 0 turns it off
    assert pol.chunked_prefill
    # PrefillAdder.add_one_req: 'input_tokens > self.rem_input_tokens and
    # len(self.can_run_list) != 0' refuses a later prompt; it is not chunked into the leftover
    assert pol.whole_prompts_after_first
    # server_args.py ServerArgs.max_prefill_tokens = 16384 (0.3.0, 0.3.6, 0.4.0-0.4.9)
    assert pol.max_prefill_tokens == 16384


@pytest.mark.parametrize(("spec", "gpu", "chunk"), [
    ("sglang@0.3", "l4", 8192), ("sglang@0.3", "h100-sxm", 8192),
    ("sglang@0.4", "l4", 2048), ("sglang@0.4", "h100-sxm", 8192)])
def test_chunk_default_is_the_release_s(spec, gpu, chunk):
    # 0.3.0 ServerArgs: chunked_prefill_size = 8192 on every GPU; 0.4.0-0.4.6 __post_init__:
    # 2048 when gpu_mem < 25,000 MB (the 24 GB L4), else 8192
    d = engine_profile(spec).defaults(load_catalog(()).gpu(gpu), 1)
    assert d.max_num_batched_tokens == chunk


def _steps(spec: str, prompts: list[int]) -> list[tuple[int, int]]:
    """The prompt steps of `prompts` arriving together, under the profile's policy with 0.3.0's
    launch defaults: chunked_prefill_size 8192, max_prefill_tokens 16384 (the policy's own)."""
    n = len(prompts)
    r = Requests(np.zeros(n), np.asarray(prompts, np.int64), np.full(n, 4, np.int64),
                 np.zeros(n, np.int64))
    rec = Recorder()
    eng = ContinuousEngine(rec, 4000, 16, 128, 8192, engine_profile(spec).scheduler)
    eng.jit = False
    eng.run(r)
    return rec.prefill


@pytest.mark.parametrize("spec", ["sglang@0.3", "sglang@0.4"])
def test_a_later_prompt_over_the_prompt_budget_ends_the_step(spec):
    # 0.3.0 PrefillAdder, by hand (no decodes subtracted: prefill-first steps):
    # step 1: A 3000 <= rem_chunk 8192, whole -> rem_chunk 5192, rem_input 13384;
    #         B 3000 whole -> 2192, 10384; C 12000 > 10384: refused, admissions end (D waits).
    # step 2: C first, 12000 > 8192: chunked at 8192 -> rem_chunk 0, the step is full.
    # step 3: C's 3808 continue (rem_chunk 4384, rem_input 12576); D 500 whole.
    assert _steps(spec, [3000, 3000, 12000, 500]) == [(6000, 2), (8192, 1), (4308, 2)]


@pytest.mark.parametrize("spec", ["sglang@0.3", "sglang@0.4"])
def test_a_later_prompt_within_the_prompt_budget_is_chunked_into_the_leftover(spec):
    # step 1: A, B whole as above (rem_chunk 2192, rem_input 10384); C 9000 <= 10384:
    #         admitted, 9000 > 2192: chunked at 2192 -> 8192 tokens, 3 prompts.
    # step 2: C's 6808 continue (rem_chunk 1384); D 500 whole.
    assert _steps(spec, [3000, 3000, 9000, 500]) == [(8192, 3), (7308, 2)]
