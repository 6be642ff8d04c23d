"""A speculative plan's draft head is a placeholder (`<EAGLE3 draft head for ...>`): the
`.k8s.yaml` and `.llm-d.yaml` headers and the run's output say to replace it, naming the
argument, and the manifest stays valid."""

from __future__ import annotations

from pathlib import Path

import yaml

from tests.export.k8s_models import validate

PLAN = {"version": 1, "model": "llama-3.1-8b", "verify": {"top": 0},
        "candidates": {"gpus": ["h100-sxm"], "tp": [1]},
        "engine": {"speculative": "eagle3", "spec_tokens": [3]},
        "workloads": [{"name": "chat", "rate_per_s": 4, "input_len": 600, "output_len": 300,
                       "slo": {"ttft_p99_s": 1.0, "tbt_p99_s": "30ms"}}]}


def test_placeholder_draft_head_is_named_in_the_header(run_cli, tmp_path: Path) -> None:
    plan = tmp_path / "p.yaml"
    plan.write_text(yaml.safe_dump(PLAN))
    k8s, llmd = tmp_path / "p.k8s.yaml", tmp_path / "p.llm-d.yaml"
    res = run_cli("plan", str(plan), "--export", str(k8s), "--export", str(llmd))
    assert res.exit_code == 0, res.stderr
    ph = "<EAGLE3 draft head for meta-llama/Llama-3.1-8B-Instruct>"
    first = k8s.read_text().splitlines()[0]
    assert f"replace {ph} (in --speculative-config)" in first
    assert first.endswith("then kubectl apply -f this file")
    assert f"replace {ph} (in --speculative-config)" in llmd.read_text().splitlines()[0]
    assert f"warning: {k8s}: replace {ph}" in res.stderr
    for doc in yaml.safe_load_all(k8s.read_text()):
        validate(doc)
    assert yaml.safe_load(llmd.read_text())


def test_no_placeholder_no_note() -> None:
    from capplan.plan.feature_flags import placeholder_note

    assert placeholder_note({"args": ["--model", "m"]}) == ""
    assert placeholder_note({"args": ["--speculative-draft-model-path",
                                      "<EAGLE draft head for m>"]}) == (
        "replace <EAGLE draft head for m> (in --speculative-draft-model-path) with the draft "
        "head's repository (a placeholder: the pods fail to start with it)")
