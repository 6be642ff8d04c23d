"""The verify command of a plan: a benchmark client sending the plan's workload to one replica
(or, for a disaggregated layout, the plan's whole workload to the front end of its P/D pools).

Each client runs the dataset capplan writes (`capplan verify --write-dataset FILE PLAN`: one
request per line, the planned prompt and output lengths and arrival times, plan/workload_file.py)
at the per-replica rate, with outputs held at the planned length (EOS ignored) and the SLOs as
goodput thresholds where the client has them. Argument names, each client's own:
- vLLM `vllm bench serve` (vllm/benchmarks/serve.py, 0.10-0.11): --dataset-name custom reads
  JSONL {"prompt", "output_tokens"}, --custom-output-len -1 takes each line's output_tokens
  (vllm/benchmarks/datasets.py CustomDataset), --ignore-eos, --goodput ttft:MS tpot:MS e2el:MS;
- SGLang `python -m sglang.bench_serving` (python/sglang/bench_serving.py, 0.5): ShareGPT JSON
  whose reply lengths set max_tokens; EOS is ignored unless --disable-ignore-eos;
- AIPerf `aiperf profile` (ai-dynamo/aiperf docs, "Custom Prompt Benchmarking", "Trace
  Replay"): --custom-dataset-type mooncake_trace JSONL {"timestamp" ms, "input_length",
  "output_length"}, --fixed-schedule replays the timestamps, --goodput with metric tags;
- GuideLLM `guidellm benchmark` (vllm-project/guidellm README): --data JSONL with prompt and
  output_tokens_count columns, --rate-type poisson.

Plans whose prompts carry images (lanes' `images_per_request`). The dataset files above carry
text only (vLLM's CustomDataset reads `prompt` alone, vllm/benchmarks/datasets/custom.py;
ShareGPT, mooncake_trace and GuideLLM's JSONL have no image field), so:
- vLLM: `--dataset-name random-mm` makes the images itself (vllm/benchmarks/datasets.py
  RandomMultiModalDataset, 0.10+; docs/benchmarking/cli.md): --backend openai-chat --endpoint
  /v1/chat/completions, --random-input-len / --random-output-len (--random-range-ratio 0: fixed
  lengths), --random-mm-base-items-per-request N with --random-mm-num-mm-items-range-ratio 0,
  --random-mm-limit-mm-per-prompt '{"image": N, "video": 0}' and --random-mm-bucket-config
  '{(H, W, 1): 1.0}' (a bucket is height, width, frames);
- SGLang: `--dataset-name image` (python/sglang/bench_serving.py sample_image_requests;
  docs/developer_guide/bench_serving.md): --image-count N, --image-resolution HxW (height x
  width), --image-format png, --image-content random, --random-input-len / --random-output-len
  with --random-range-ratio 1 (fixed lengths), --apply-chat-template, on the native
  `--backend sglang`;
- AIPerf's mooncake_trace and GuideLLM's JSONL carry no images: their line is capplan's own
  client (`capplan verify PLAN.json --endpoint URL`), which sends each request's images as
  data URLs in a chat completion (capplan/probe/replay.py).
Synthetic datasets hold one text length, image count and size for every request: the plan's
mean text and output tokens and its largest lane's images.
"""

from __future__ import annotations

import json
import math
import re
import shlex
from dataclasses import dataclass
from typing import Any

CLIENTS = ("vllm", "sglang", "aiperf", "guidellm")
DEFAULT_CLIENT = {"vllm": "vllm", "sglang": "sglang", "trtllm": "aiperf"}
"""Each engine's own client; TensorRT-LLM's serving benchmarks use AIPerf (trtllm-serve docs)."""
DATASET_SUFFIX = {"vllm": ".jsonl", "sglang": ".sharegpt.json", "aiperf": ".mooncake.jsonl",
                  "guidellm": ".guidellm.jsonl", "capplan": ".jsonl"}


@dataclass(frozen=True)
class BenchImages:
    """The images a plan's requests carry, for a synthetic image dataset: `count` images of
    `width` x `height` px, `text_tokens` text and `output_tokens` output tokens per request."""

    count: int
    width: int
    height: int
    text_tokens: int
    output_tokens: int


DATASET_STEM = "capplan-workload"
VERIFY_PLAN = "capplan verify PLAN.json"
"""How a printed line calls verify; the CLI names the JSON just exported in its place."""
STEP_LABELS = {"bench_dataset": "dataset", "bench": "verify", "bench_goodput": "goodput"}
"""What every output calls a plan's verify steps (`verify_lines`' keys): the terminal's
`dataset:` and `verify:` lines (`step_lines`), the HTML and Markdown reports' titles; `goodput`:
a shell comment saying which lanes' SLOs the verify line of a mixed load does not check."""
LANE_SLOS = {"ttft_p99_s": "TTFT p99", "tbt_p99_s": "TBT p99", "tpot_p99_s": "TPOT p99",
             "tpot_mean_s": "TPOT mean", "e2e_p99_s": "E2E p99"}
"""A lane's SLOs (plan.slo.SloSet) as the notes name them."""
GOODPUT_METRICS = {"ttft_p99_s": {"vllm": "ttft", "aiperf": "time_to_first_token"},
                   "tpot_p99_s": {"vllm": "tpot", "aiperf": "inter_token_latency"},
                   "e2e_p99_s": {"vllm": "e2el", "aiperf": "request_latency"}}
"""The SLOs a client's --goodput can hold a request to, with each client's metric name (a
lane's TBT p99 and TPOT mean have none)."""
GOODPUT_CLIENTS = frozenset(c for names in GOODPUT_METRICS.values() for c in names)
"""The clients whose benchmark has a --goodput (those GOODPUT_METRICS names a metric for)."""


def goodput_terms(client: str, slo: dict[str, float | None]) -> list[str]:
    """The client's --goodput thresholds ("ttft:500", ...) of the SLOs `slo` sets."""
    return [f"{names[client]}:{_ms(v)}" for key, names in GOODPUT_METRICS.items()
            if (v := slo.get(key))]


def step_lines(steps: dict[str, Any]) -> list[str]:
    """The terminal's lines of the verify steps `steps` holds ("dataset: ...", "verify:  ...",
    labels one column wide), a step it lacks or leaves empty left out."""
    width = max(map(len, STEP_LABELS.values())) + 2
    return [_wrapped(f"{label}:".ljust(width) + str(steps[key]), width, key)
            for key, label in STEP_LABELS.items() if steps.get(key)]


_NBSP = "\x00"
"""What stands for a space inside a command while a note is wrapped (not whitespace to
textwrap)."""


def _wrapped(line: str, width: int, key: str) -> str:
    """A command stays one line (to copy); the goodput note, a shell comment, wraps at 120
    columns, each line a comment, between its words only: a command it names (`...`) stays
    whole on one line, so it copies as printed and its PLAN.json is the one reading_plan
    names."""
    if key != "bench_goodput":
        return line
    import textwrap

    whole = re.sub(r"`[^`]*`", lambda m: m[0].replace(" ", _NBSP), line)  # one unbreakable word
    return textwrap.fill(whole, 120, subsequent_indent=" " * width + "# ",
                         break_on_hyphens=False, break_long_words=False).replace(_NBSP, " ")


def bench_url(bench: Any) -> str:
    """The server URL a verify line's client sends to (its --base-url, --url or --target)."""
    words = str(bench or "").split()
    return next((words[i + 1] for i, w in enumerate(words[:-1])
                 if w in ("--base-url", "--url", "--target")), "http://localhost:8000")


MEASURE = "measure"
"""What the reports call a verify step's read-back: the verify call that measures the
endpoint the verify line sends to."""


def lane_steps(steps: dict[str, Any], lane: str, *, measure: bool = False,
               model: str | None = None) -> list[tuple[str, str, str]]:
    """(key, label, line) of a lane's own pool's verify steps, those `steps` (the lane's
    engine_flags) holds in STEP_LABELS' order; `measure`: then the verify call that measures
    its pool's endpoint (`capplan verify PLAN.json --lane NAME --endpoint URL`, naming
    `model`, one of a plan of several: verify_call) when it has a verify line. One builder
    for the terminal (lane_step_lines), Markdown and HTML."""
    out = [(key, label, str(steps[key])) for key, label in STEP_LABELS.items()
           if steps.get(key)]
    if measure and steps.get("bench"):
        out.append((MEASURE, MEASURE, f"{verify_call(model)} --lane {shlex.quote(lane)} "
                                      f"--endpoint {bench_url(steps['bench'])}"))
    return out


def lane_step_lines(steps: dict[str, Any], lane: str) -> list[str]:
    """A lane's own pool's verify steps for the terminal ("dataset (lane NAME): ...")."""
    return [_wrapped(f"{label} (lane {lane}): {line}", 4, key)
            for key, label, line in lane_steps(steps, lane)]


def dataset_name(client: str, stem: str = DATASET_STEM) -> str:
    return stem + DATASET_SUFFIX[client]


def reading_plan(text: str, path: Any, escape: Any = None) -> str:
    """`text` with its verify calls reading `path`, the plan JSON a run exported, instead of
    the placeholder PLAN.json (unchanged without one); `escape`: the format's escaping of the
    quoted path (HTML's)."""
    if not path:
        return text
    quoted = shlex.quote(str(path))
    return text.replace(VERIFY_PLAN, f"capplan verify {escape(quoted) if escape else quoted}")


def verify_call(model: str | None = None) -> str:
    """`capplan verify PLAN.json`, naming the model (`--model NAME`) for one model of a plan
    of several."""
    return VERIFY_PLAN + ("" if model is None else f" --model {shlex.quote(model)}")


def _safe_name(name: str) -> str:
    """A model's or lane's name as part of a file name."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name)


def _calling(flags: dict[str, Any], call: str, stem: str) -> dict[str, Any]:
    """`flags` with its verify steps (STEP_LABELS: the goodput note's verify call too) calling
    `call` in place of
    `capplan verify PLAN.json` and writing and reading the dataset file `stem`.* in place of
    capplan-workload.* (a lane's capplan-workload-lane-NAME.*: `stem`-lane-NAME.*)."""
    named = re.compile(re.escape(DATASET_STEM) + r"(?=\.|-lane-)")  # one pass: a stem once
    return {**flags, **{k: named.sub(stem, flags[k].replace(VERIFY_PLAN, call))
                        for k in STEP_LABELS if isinstance(flags.get(k), str)}}


def _plan_calling(plan: dict[str, Any], call: str, stem: str) -> dict[str, Any]:
    """A plan dict with every verify step it prints calling `call` and naming the dataset
    `stem` (_calling): the recommendations', a disaggregated layout's, its lanes' pools' and
    its lanes' own day plans' (`lane_days`)."""
    out = {**plan, "recommendations": [
        {**r, "engine_flags": _calling(r.get("engine_flags") or {}, call, stem)}
        for r in plan.get("recommendations") or []]}
    for key in ("disaggregated", "fixed_disaggregated"):
        if isinstance(plan.get(key), dict):
            out[key] = _calling(plan[key], call, stem)
    sep = (plan.get("pools") or {}).get("separate") or {}
    if isinstance(sep.get("lanes"), list):  # each lane's pool (`capplan verify --lane NAME`)
        out["pools"] = {**plan["pools"], "separate": {**sep, "lanes": [
            {**ln, "engine_flags": _calling(ln["engine_flags"], call, stem)}
            if isinstance(ln, dict) and isinstance(ln.get("engine_flags"), dict) else ln
            for ln in sep["lanes"]]}}
    if isinstance(plan.get("lane_days"), list):  # each lane's day (lane_plan wrote its lane)
        out["lane_days"] = [_plan_calling(d, call, stem) if isinstance(d, dict) else d
                            for d in plan["lane_days"]]
    return out


def for_model(plan: dict[str, Any], model: str) -> dict[str, Any]:
    """One model's plan dict in a plan of several: its printed verify steps (the
    recommendations', a disaggregated layout's, its lanes' pools' and its lanes' own day
    plans') call verify with `--model NAME`, the one JSON holding every model, and write and
    read the model's own dataset files (capplan-workload-NAME.jsonl,
    capplan-workload-NAME-lane-LANE.jsonl), so two models' datasets in one folder stay
    apart."""
    return _plan_calling(plan, verify_call(model), f"{DATASET_STEM}-{_safe_name(model)}")


def lane_plan(plan: dict[str, Any], lane: str) -> dict[str, Any]:
    """A lane's own day plan dict (a plan of a pool per lane, `lane_days`): its verify steps
    call `capplan verify PLAN.json --lane NAME` and name the lane's dataset file, as its
    pool's (for_lane) do; for_model adds the model to both."""
    return _plan_calling(plan, f"{VERIFY_PLAN} --lane {shlex.quote(lane)}", lane_stem(lane))


def lane_stem(lane: str) -> str:
    """A lane's dataset file stem (capplan-workload-lane-NAME), apart from other lanes'."""
    return f"{DATASET_STEM}-lane-{_safe_name(lane)}"


def for_lane(flags: dict[str, Any], lane: str) -> dict[str, Any]:
    """A lane's own pool's flags (a plan of a pool per lane) with its verify steps calling
    `capplan verify PLAN.json --lane NAME`, which writes that lane's requests alone at its
    pool's per-replica rate, into the lane's own dataset file (lane_stem), which its verify
    line reads."""
    return _calling(flags, f"{VERIFY_PLAN} --lane {shlex.quote(lane)}", lane_stem(lane))


def shared_slos(lane_slos: list[tuple[str, Any]]) -> tuple[dict[str, float | None], list[str]]:
    """The p99 SLOs a client's --goodput can hold every request of a mixed load to: those every
    lane has, with one value (goodput applies each threshold to every request, whatever its
    lane); and the lanes' SLOs it leaves out, each as "lane NAME's TTFT p99 500 ms" (a TBT
    p99 or TPOT mean always: no --goodput checks them)."""
    common: dict[str, float | None] = {}
    left: list[str] = []
    for key, label in LANE_SLOS.items():
        vals = [getattr(s, key, None) for _, s in lane_slos]
        one = key in GOODPUT_METRICS and len(set(vals)) == 1 and vals[0] is not None
        if key in GOODPUT_METRICS:
            common[key] = vals[0] if one else None
        if not one:
            left += [f"lane {name}'s {label} {_dur(v)}"
                     for (name, _), v in zip(lane_slos, vals, strict=True) if v]
    return common, left


def unchecked_note(client: str, left: list[str], common: dict[str, float | None],
                   call: str, lanes: int = 2) -> str:
    """The `goodput` step of a verify line ("" when it checks every SLO): a shell comment
    naming what it leaves out and `call`, the verify call that checks it (`capplan verify
    PLAN.json --endpoint URL` at the line's own server; for_lane and for_model add the lane
    and the model it needs). `lanes`: how many lanes the load mixes (one: a pool of its own,
    or a plan of one lane)."""
    if not left:
        return ""
    shared = ", ".join(f"{LANE_SLOS[k]} {_dur(common[k])}" for k in GOODPUT_METRICS
                       if common.get(k))
    call = f"`{call}`"
    if lanes == 1:
        if client not in GOODPUT_CLIENTS:
            held = "the client has no --goodput"
        elif shared:
            held = f"--goodput holds the lane's requests to its SLOs ({shared})"
        else:
            held = "no SLO of the lane has a --goodput metric, so the line has no --goodput"
        return (f"# {held}; not checked: {', '.join(left)}; {call} sends the lane's requests "
                "and checks its p99s against its SLOs")
    if client not in GOODPUT_CLIENTS:
        held = "the client's p99s mix every lane's requests"
    elif shared:
        held = f"--goodput holds every request to the SLOs every lane has ({shared})"
    else:
        held = "the lanes have no SLO in common, so the line has no --goodput"
    return (f"# the lanes share this load: {held}; not checked: {', '.join(left)}; "
            f"{call} sends the same mix and checks each lane's p99s against its own SLOs")


def _dur(x: float | None) -> str:
    """A duration in ms below 10 s, else in s."""
    if x is None:
        return "?"
    return f"{x * 1e3:.4g} ms" if x < 10 else f"{x:.4g} s"


def num_prompts(rate_per_s: float) -> int:
    """Five minutes of traffic at the per-replica rate, at least 200 requests."""
    return max(200, math.ceil(rate_per_s * 300))


def _ms(x: float) -> str:
    return f"{x * 1e3:.0f}"


def _vllm_goodput(slo: dict[str, float | None]) -> list[str]:
    good = goodput_terms("vllm", slo)
    return ["--goodput", *good] if good else []


def image_bench_command(client: str, *, model_id: str, base_url: str, rate_per_s: float,
                        slo: dict[str, float | None], images: BenchImages) -> str:
    """The client's command for a plan whose prompts carry images: a synthetic image dataset
    (vLLM random-mm, SGLang image), else capplan's own client, which sends them."""
    n, im = num_prompts(rate_per_s), images
    if client == "vllm":
        w = ["vllm", "bench", "serve", "--backend", "openai-chat", "--base-url", base_url,
             "--endpoint", "/v1/chat/completions", "--model", model_id,
             "--dataset-name", "random-mm", "--random-input-len", str(im.text_tokens),
             "--random-output-len", str(im.output_tokens), "--random-range-ratio", "0",
             "--random-mm-base-items-per-request", str(im.count),
             "--random-mm-num-mm-items-range-ratio", "0",
             "--random-mm-limit-mm-per-prompt", json.dumps({"image": im.count, "video": 0}),
             "--random-mm-bucket-config", f"{{({im.height}, {im.width}, 1): 1.0}}",
             "--ignore-eos", "--request-rate", f"{rate_per_s:.4g}", "--num-prompts", str(n),
             "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,90,99"]
        return shlex.join(w + _vllm_goodput(slo))
    if client == "sglang":
        w = ["python", "-m", "sglang.bench_serving", "--backend", "sglang", "--base-url",
             base_url, "--model", model_id, "--dataset-name", "image",
             "--image-count", str(im.count), "--image-resolution", f"{im.height}x{im.width}",
             "--image-format", "png", "--image-content", "random",
             "--random-input-len", str(im.text_tokens),
             "--random-output-len", str(im.output_tokens), "--random-range-ratio", "1",
             "--apply-chat-template", "--num-prompts", str(n),
             "--request-rate", f"{rate_per_s:.4g}"]
        return shlex.join(w)
    return (f"{VERIFY_PLAN} --endpoint {shlex.quote(base_url)}"
            + f"  # {CANNOT_SEND_IMAGES[client]}: capplan's client sends them")


CANNOT_SEND_IMAGES = {"aiperf": "AIPerf's mooncake_trace dataset carries no images",
                      "guidellm": "GuideLLM's JSONL dataset carries no images"}


def bench_command(client: str, *, model_id: str, base_url: str, rate_per_s: float,
                  slo: dict[str, float | None], trace: bool = False,
                  images: BenchImages | None = None) -> str:
    """The client's command line for the plan's workload (dataset file from dataset_name);
    `images`: the requests carry images (image_bench_command)."""
    if images is not None:
        return image_bench_command(client, model_id=model_id, base_url=base_url,
                                   rate_per_s=rate_per_s, slo=slo, images=images)
    n = num_prompts(rate_per_s)
    data = dataset_name(client)
    if client == "vllm":
        w = ["vllm", "bench", "serve", "--backend", "openai", "--base-url", base_url,
             "--endpoint", "/v1/completions", "--model", model_id, "--dataset-name", "custom",
             "--dataset-path", data, "--custom-output-len", "-1",
             "--custom-skip-chat-template", "--ignore-eos", "--request-rate", f"{rate_per_s:.4g}",
             "--num-prompts", str(n), "--percentile-metrics", "ttft,tpot,itl,e2el",
             "--metric-percentiles", "50,90,99"]
        return shlex.join(w + _vllm_goodput(slo))
    if client == "sglang":
        w = ["python", "-m", "sglang.bench_serving", "--backend", "sglang", "--base-url",
             base_url, "--model", model_id, "--dataset-name", "sharegpt", "--dataset-path", data,
             "--num-prompts", str(n), "--request-rate", f"{rate_per_s:.4g}"]
        return shlex.join(w)
    if client == "aiperf":
        w = ["aiperf", "profile", "--model", model_id, "--url", base_url,
             "--endpoint-type", "completions", "--streaming", "--input-file", data,
             "--custom-dataset-type", "mooncake_trace", "--fixed-schedule",
             "--extra-inputs", "ignore_eos:true"]
        good = goodput_terms("aiperf", slo)
        return shlex.join(w + (["--goodput", " ".join(good)] if good else []))
    if client == "guidellm":
        w = ["guidellm", "benchmark", "--target", base_url, "--model", model_id,
             "--data", data, "--rate-type", "constant" if trace else "poisson",
             "--rate", f"{rate_per_s:.4g}", "--max-requests", str(n)]
        return shlex.join(w)
    raise ValueError(client)


def verify_lines(model_id: str, rate_per_s: float, engine: str, port: int | tuple[str, int],
                 slos: Any,
                 client: str | None = None, layout: str = "aggregated",
                 images: BenchImages | None = None) -> dict[str, str]:
    """A plan's `bench_dataset` step (`capplan verify --write-dataset`) and `bench` command
    (the engine's own client, DEFAULT_CLIENT, unless `client`) for one replica at `port` (on
    localhost, or a (host, port)), or,
    with `layout` "disaggregated", for the whole P/D deployment behind its front end, which
    takes the plan's whole rate; SLOs given as an object with their p99s as attributes (a
    Traffic's `slos`; None: none). With `images` the command sends them (image_bench_command)
    and needs no dataset file (`bench_dataset` empty). `slos` may be the Traffic itself: with
    its `lane_slos` ((lane, its SLOs) of each lane the load mixes) the goodput thresholds are
    those every lane shares (shared_slos), and the `bench_goodput` step names the lanes' SLOs
    left out."""
    client = client or DEFAULT_CLIENT.get(engine, "vllm")
    lane_slos = list(getattr(slos, "lane_slos", None) or ())
    slos = getattr(slos, "slos", slos)
    slo: dict[str, float | None] = {k: getattr(slos, k, None) for k in GOODPUT_METRICS}
    left: list[str] = []
    if lane_slos:
        slo, left = shared_slos(lane_slos)
    which = "" if layout == "aggregated" else f" --layout {layout}"
    host, port = port if isinstance(port, tuple) else ("localhost", port)
    url = f"http://{host}:{port}"
    bench = bench_command(client, model_id=model_id, base_url=url, rate_per_s=rate_per_s,
                          slo=slo, images=images)
    out = {"bench": bench,
           "bench_dataset": "" if images is not None else
           f"{VERIFY_PLAN}{which} --client {client} "
           f"--write-dataset {dataset_name(client)}"}
    note = unchecked_note(client, left, slo, f"{VERIFY_PLAN}{which} --endpoint {url}",
                          len(lane_slos))
    return {**out, "bench_goodput": note} if note else out
