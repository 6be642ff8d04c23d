"""Wrong answers accepted in silence (issue 30, defect 5): each is now honoured or refused.

Before: the disaggregated layout ignored --max-num-seqs and "won" with 1024-sequence pools;
`--shared-prefix` longer than the prompt was accepted (a verify line with
`--random-input-len -16776216`); `slo: {tbt_p99_s: true}` was read as 1 s; `prefix:
{hit_rate: 0.5, think_s: 100}` was accepted with think_s ignored.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from _asserts import assert_one_line_error

PLAN = {"version": 1, "model": "llama-3.1-8b", "candidates": {"gpus": ["h100-sxm"]},
        "verify": {"top": 0},
        "workloads": [{"name": "chat", "rate_per_s": 2, "input_len": 1000, "output_len": 200,
                       "slo": {"ttft_p99_s": 2.0}}]}


def test_disaggregated_pools_keep_the_users_max_num_seqs(run_cli) -> None:  # noqa: ANN001
    r = run_cli("recommend", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--rate", "20",
                "--input-len", "1000", "--output-len", "200", "--max-num-seqs", "3",
                "--tbt-p99", "0.05", "--verify-top", "0", "--format", "json")
    assert r.exit_code == 0, r.stderr
    out = r.json()
    assert out["recommendations"][0]["max_num_seqs"] == 3
    d = out["disaggregated"]
    assert d["prefill"]["max_num_seqs"] == 3 and d["decode"]["max_num_seqs"] == 3


@pytest.mark.parametrize("cmd", ["latency", "simulate"])
def test_shared_prefix_longer_than_the_prompt_is_refused(run_cli, cmd: str) -> None:  # noqa: ANN001
    r = run_cli(cmd, "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--rate", "5",
                "--input-len", "1000", "--output-len", "100", "--shared-prefix", "16777216")
    assert_one_line_error(r, "shared prefix of 16,777,216 tokens is the start of each prompt")


@pytest.mark.parametrize("lane_change, says", [
    ({"slo": {"ttft_p99_s": 2.0, "tbt_p99_s": True}}, "is not a duration"),
    ({"prefix": {"hit_rate": 0.5, "think_s": 100}}, "think_s applies with turns only"),
    ({"prefix": {"hit_rate": 0.5, "share": 0.5}}, "share applies with shared_tokens only"),
])
def test_plan_fields_read_wrongly_are_refused(run_cli, tmp_path: Path, lane_change: dict,  # noqa: ANN001
                                              says: str) -> None:
    p = tmp_path / "plan.yaml"
    p.write_text(yaml.safe_dump({**PLAN, "workloads": [{**PLAN["workloads"][0],
                                                        **lane_change}]}))
    assert_one_line_error(run_cli("plan", str(p)), says)
