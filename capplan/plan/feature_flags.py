"""Launch flags of speculative decoding, LoRA and images, per engine (capplan/plan/flags.py
appends them to its lines).

vLLM (0.10-0.11 `vllm serve --help`, docs/features/spec_decode.md and lora.md):
--speculative-config JSON {method, model, num_speculative_tokens}, --enable-lora --max-loras
--max-lora-rank, --limit-mm-per-prompt JSON {"image": N}. SGLang (0.5 server_args.py,
docs/advanced_features/speculative_decoding.md and lora.md): --speculative-algorithm
EAGLE3|EAGLE|NGRAM|STANDALONE (MTP checkpoints run as EAGLE on the model itself)
--speculative-draft-model-path --speculative-num-steps --speculative-eagle-topk
--speculative-num-draft-tokens; --enable-lora --max-loras-per-batch --max-lora-rank
--lora-target-modules (required without --lora-paths).
TensorRT-LLM (1.x llm_args.py): speculative_config {decoding_type: Eagle3|Eagle|MTP|NGram|
Draft_Target, max_draft_len (MTP: num_nextn_predict_layers), speculative_model} and
lora_config {max_loras, max_lora_rank} in the LLM-API options YAML (capplan.plan.launch's
trtllm_line writes it).
"""

from __future__ import annotations

import json
import re
from typing import Any

from capplan.models.speculative import DEFAULT_SPEC_TOKENS, parse_method

_SGLANG_ALGO = {"eagle3": "EAGLE3", "eagle": "EAGLE", "mtp": "EAGLE", "ngram": "NGRAM",
                "draft": "STANDALONE"}
_TRT_TYPE = {"eagle3": "Eagle3", "eagle": "Eagle", "mtp": "MTP", "ngram": "NGram",
             "draft": "Draft_Target"}


DRAFT_PLACEHOLDER = re.compile(r"<[A-Z0-9]+ draft head for [^>]+>")
"""The name a launch line gives a speculative plan's draft head (the head's repository is
yours to pick, docs/features.md): a manifest running it fails until it is replaced."""


def placeholders(obj: Any) -> list[tuple[str, str]]:
    """(placeholder, the argument holding it) for each draft-head placeholder in `obj` (a
    manifest's objects, values, or a text), once each: the flag before it in an argument list
    (`--speculative-config`), or the key holding it (`speculative_model`)."""
    found: dict[tuple[str, str], None] = {}

    def walk(x: Any, where: str) -> None:
        if isinstance(x, dict):
            for k, v in x.items():
                walk(v, str(k))
        elif isinstance(x, list):
            for i, v in enumerate(x):
                before = x[i - 1] if i and isinstance(x[i - 1], str) else ""
                walk(v, before if before.startswith("-") else where)
        elif isinstance(x, str):
            for m in DRAFT_PLACEHOLDER.finditer(x):
                words = x[:m.start()].split()
                flag = next((w for w in reversed(words) if w.startswith("--")), where)
                found[(m.group(0), flag.split("=")[0])] = None

    walk(obj, "")
    return list(found)


def placeholder_note(obj: Any) -> str:
    """"replace <EAGLE3 draft head for M> (--speculative-config's model) with ..." ('' when
    `obj` has no placeholder)."""
    got = placeholders(obj)
    if not got:
        return ""
    return "replace " + "; ".join(f"{ph} (in {arg})" for ph, arg in got) + (
        " with the draft head's repository (a placeholder: the pods fail to start with it)")


def _draft_path(method: str, arg: str | None, r: dict[str, Any], hf: str) -> str | None:
    if method == "draft":
        return r.get("draft_hf_id") or arg
    if method in ("eagle3", "eagle"):
        return f"<{method.upper()} draft head for {hf}>"
    return None


def _speculative(r: dict[str, Any], hf: str, out: dict[str, list[str]],
                 trt_yaml: list[str]) -> None:
    """Speculative decoding's flags per engine, appended to `out` and `trt_yaml`."""
    spec, k = r.get("speculative"), r.get("spec_tokens")
    if not spec or k == 0:
        return
    method, arg = parse_method(spec)
    k = k if k is not None else DEFAULT_SPEC_TOKENS[method]
    draft = _draft_path(method, arg, r, hf)
    cfg: dict[str, Any] = {"method": {"draft": "draft_model"}.get(method, method),
                           "num_speculative_tokens": k}
    if draft:
        cfg["model"] = draft
    if method == "ngram":
        cfg["prompt_lookup_max"] = 4
    out["vllm"] += ["--speculative-config", json.dumps(cfg)]
    topk = r.get("spec_topk") or 1
    verify = r.get("spec_draft_tokens") or (k * topk if topk > 1 else k) + 1
    out["sglang"] += ["--speculative-algorithm", _SGLANG_ALGO[method]]
    if draft:
        out["sglang"] += ["--speculative-draft-model-path", draft]
    out["sglang"] += ["--speculative-num-steps", str(k), "--speculative-eagle-topk",
                      str(topk), "--speculative-num-draft-tokens", str(verify)]
    # TensorRT-LLM 1.x llm_args.py: MTPDecodingConfig counts num_nextn_predict_layers (N
    # modules, N drafts); the others take max_draft_len and, with a drafter, its path.
    trt_yaml += ["speculative_config:", f"  decoding_type: {_TRT_TYPE[method]}",
                 f"  num_nextn_predict_layers: {k}" if method == "mtp"
                 else f"  max_draft_len: {k}"]
    if draft:
        trt_yaml.append(f"  speculative_model: {json.dumps(draft)}")


def feature_launch(r: dict[str, Any], hf: str
                   ) -> tuple[dict[str, tuple[str, ...]], tuple[str, ...]]:
    """(extra argv words per engine, TensorRT-LLM LLM-API YAML lines) for the features in a
    recommendation/settings dict (keys as EngineSettings names them); empty when none is on.
    capplan.plan.launch.options_from puts them in LaunchOptions.extra / .llm_api_options."""
    out: dict[str, list[str]] = {"vllm": [], "sglang": [], "trtllm": []}
    trt_yaml: list[str] = []
    _speculative(r, hf, out, trt_yaml)
    loras, rank = r.get("max_loras") or 0, r.get("max_lora_rank") or 16
    if loras:
        out["vllm"] += ["--enable-lora", "--max-loras", str(loras), "--max-lora-rank", str(rank)]
        # SGLang server_args: with no --lora-paths, --max-lora-rank and --lora-target-modules
        # are both required ("all": utils/common.py LORA_TARGET_ALL_MODULES)
        out["sglang"] += ["--enable-lora", "--max-loras-per-batch", str(loras),
                          "--max-lora-rank", str(rank), "--lora-target-modules", "all"]
        trt_yaml += ["lora_config:", f"  max_loras: {loras}", f"  max_lora_rank: {rank}"]
    images = r.get("images_per_request") or 0
    if images:
        out["vllm"] += ["--limit-mm-per-prompt", json.dumps({"image": images})]
    return {e: tuple(w) for e, w in out.items()}, tuple(trt_yaml)
