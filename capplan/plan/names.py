"""What the user gave, named as the user gave it: a plan file's key (with its file:line) or a
command-line flag. The planner's checks are shared by `plan FILE` and `recommend`, so their
messages name a setting one way; `KEY_FLAGS` is the one table between a plan file's keys and
`recommend`'s flags, and `as_flags` / `as_keys` turn a message into the other vocabulary.
`in_file` adds the line of what a plan file's error names: the key, else the value it quotes
('h1000', '25:00')."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

KEY_FLAGS: tuple[tuple[str, str], ...] = (
    ("engine.speculative", "--speculative"),
    ("engine.spec_tokens", "--spec-tokens"),
    ("engine.spec_topk", "--spec-topk"),
    ("engine.spec_draft_tokens", "--spec-draft-tokens"),
    ("engine.acceptance_length", "--acceptance-length"),
    ("engine.acceptance_kind", "--spec-workload"),
    ("engine.max_loras", "--max-loras"),
    ("engine.max_lora_rank", "--max-lora-rank"),
    ("engine.name", "--engine"),
    ("engine.max_num_seqs", "--max-num-seqs"),
    ("engine.max_num_batched_tokens", "--max-num-batched-tokens"),
    ("engine.max_model_len", "--max-model-len"),
    ("engine.gpu_memory_utilization", "--gpu-memory-utilization"),
    ("engine.block_size", "--block-size"),
    ("candidates.gpus", "--gpu"),
    ("candidates.tp", "--tp"),
    ("candidates.prices", "--price"),
    ("candidates.weight_dtypes", "--weight-dtype"),
    ("candidates.kv_dtypes", "--kv-dtype"),
    ("day.timezone", "--timezone"),
    ("headroom", "--headroom"),
    ("objective", "--objective"),
    ("export", "--export"),
    ("model", "--model"),
    ("disaggregated_layout.kv_link", "--kv-link"),
    *((f"disaggregated_layout.{role}.{key}", f"--{role}-{flag}") for role in ("prefill", "decode")
      for key, flag in (("workers", "workers"), ("tp", "tp"), ("pp", "pp"), ("gpu", "gpu"),
                        ("attention_dp", "attention-dp"),
                        ("expert_parallel", "expert-parallel"),
                        ("max_num_seqs", "max-num-seqs"),
                        ("max_num_batched_tokens", "max-num-batched-tokens"))),
    ("workloads.rate_per_s", "--rate"),
    ("workloads.input_len", "--input-len"),
    ("workloads.output_len", "--output-len"),
    ("workloads.burstiness", "--burstiness"),
    ("workloads.slo.ttft_p99_s", "--ttft-p99"),
    ("workloads.slo.tbt_p99_s", "--tbt-p99"),
    ("workloads.slo.e2e_p99_s", "--e2e-p99"),
    ("workloads.slo.tpot_p99_s", "--tpot-p99"),
    ("workloads.slo.tpot_mean_s", "--tpot-mean"),
    ("workloads.adapters", "--adapters"),
    ("workloads.popularity", "--popularity"),
    ("workloads.images_per_request", "--images-per-request"),
    ("workloads.image_width", "--image-width"),
    ("workloads.image_height", "--image-height"),
    ("workloads.trace", "--trace"),
    ("workloads.rate_curve", "--rate-curve"),
    ("workloads.time_unit", "--time-unit"),
    ("day.min_replicas", "--min-replicas"),
    ("verify.top", "--verify-top"),
)
"""(plan-file key, the command line's flag) of each setting both take; a lane's key
(`workloads.input_len`) stands for each lane's (`workloads.0.input_len`)."""


def _flag_re(flag: str) -> re.Pattern[str]:
    return re.compile(r"(?<![\w-])" + re.escape(flag) + r"(?![\w-])")


def _key_re(key: str) -> re.Pattern[str]:
    """`key` as a message names it: a lane's key with its lane's index or without."""
    head, dot, rest = key.partition(".")
    body = (re.escape(head) + r"(\.\d+)?\." + re.escape(rest) if head == "workloads" and dot
            else re.escape(key))
    return re.compile(r"(?<![\w.-])" + body + r"(?![\w-])")


_CLI_ADVICE = re.compile(r"[^);]*command line")
"""What follows a flag that is advice about the command line ("or pass --export on the
command line"): a flag in such a clause is kept."""


def as_keys(msg: str) -> str:
    """`msg` with each flag it names as the plan file's key ("--speculative 'medusa': ...
    pass --acceptance-length" -> "engine.speculative 'medusa': ... pass
    engine.acceptance_length"); a flag in a clause about the command line ("or pass --export
    on the command line") is kept."""
    for key, flag in KEY_FLAGS:
        msg = _flag_re(flag).sub(
            lambda m, key=key: m.group(0) if _CLI_ADVICE.match(m.string, m.end()) else key, msg)
    return msg


def as_flags(msg: str) -> str:
    """`msg` with each plan-file key it names (a dotted one: engine.x, candidates.x, day.x,
    workloads.N.x) as the command-line flag."""
    for key, flag in KEY_FLAGS:
        if "." in key:
            msg = _key_re(key).sub(flag, msg)
    return msg


def _nodes(node: Any, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    """Every (key path, node) of a composed YAML document, depth first."""
    out = [(path, node)]
    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            out += [((*path, str(k.value)), k)] + _nodes(v, (*path, str(k.value)))
    elif isinstance(node, yaml.SequenceNode):
        for i, v in enumerate(node.value):
            out += _nodes(v, (*path, str(i)))
    return out


def line_of(text: str, msg: str) -> int | None:
    """The 1-based line of what `msg` names in the plan file `text`: the first dotted or
    top-level key it names (as the file spells it), else the first value it quotes."""
    try:
        root = yaml.compose(text)
    except yaml.YAMLError:
        return None
    if root is None:
        return None
    nodes = _nodes(root)
    keys = {".".join(p for p in path if not p.isdigit()): n for path, n in nodes
            if path and isinstance(n, yaml.ScalarNode) and n.value == path[-1]}
    named = sorted((m.start(), key) for key, _ in KEY_FLAGS if key in keys
                   for m in [_key_re(key).search(msg)] if m)
    if named:  # the key the message names first (its subject), as the file spells it
        return keys[named[0][1]].start_mark.line + 1
    for quoted in re.findall(r"'([^']+)'", msg):
        for path, n in nodes:
            if path and isinstance(n, yaml.ScalarNode) and n.value == quoted:
                return n.start_mark.line + 1
    return None


def in_file(path: str | Path, msg: str) -> str:
    """A plan file's error as the file names it: "FILE:LINE: msg" with its flags as keys
    (FILE: alone when no line is found)."""
    msg = as_keys(msg)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        text = ""
    line = line_of(text, msg) if text else None
    return f"{path}:{line}: {msg}" if line else f"{path}: {msg}"
