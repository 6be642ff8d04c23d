"""The plan's workload as requests a benchmark client sends to one replica, and the dataset
files each client reads (capplan/plan/bench_cmds.py names the clients and their sources).

The requests are drawn from the plan's lanes as the simulator draws them (capplan.sim.workload:
the lanes' arrival processes and length distributions, at the per-replica rate), or replay a
trace's timestamps (every `replicas`-th request: one replica's share of a round-robin router).
A prompt of n tokens is n - 1 common English words (about one token each for Llama and GPT
tokenizers, plus the BOS token), drawn per request from a seeded generator: no two prompts
share their first block, so a server's prefix cache (hash-chained blocks) finds no hit the plan
did not count on. The lengths the server counts are the planned ones within a few tokens; the
clients report what they measured.

A lane with images (`images_per_request`, `image_width`, `image_height`) gives each of its
requests that many PNG images of that size beside its text tokens (`input_len`, the text as the
plan file gave it): capplan's own dataset carries them as data URLs (`images`), which capplan's
endpoint client sends in a chat completion. Each image is one gray field whose last row's first
pixel is unique to the request and image (the server's multimodal cache finds no hit; the
encoder's work depends on the size alone), a few KB compressed. The other clients' files carry
no images (capplan/plan/bench_cmds.py): writing them for such a plan is refused.
"""

from __future__ import annotations

import base64
import json
import struct
import zlib
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from capplan.errors import InputError
from capplan.export.atomic import atomic_write_text
from capplan.plan.bench_cmds import num_prompts
from capplan.sim.workload import Lane as SimLane
from capplan.sim.workload import LengthDist, Workload, load_trace, parse_length

WORD = "hello "
WORDS = ("the of and to in is it that for on was with as at by be this from or an are not but "
         "all one can has more out up so what about there time some new would into other day "
         "also work first way many then make well just").split()
"""Common words, each one token after a space in Llama-3 and GPT BPE vocabularies."""


@dataclass(frozen=True)
class PlannedRequest:
    arrival_s: float
    input_tokens: int
    output_tokens: int
    lane: str
    index: int = 0
    images: int = 0
    """Images in the prompt (each image_width x image_height px), beside input_tokens of text."""
    image_width: int = 0
    image_height: int = 0
    image_tokens: int = 0
    """The images' tokens, as the plan counted them (the prompt is input_tokens + these)."""

    @property
    def prompt(self) -> str:
        """input_tokens - 1 words (BOS makes the last token), unique to this request."""
        rng = np.random.default_rng(self.index)
        picks = rng.integers(0, len(WORDS), max(1, self.input_tokens - 1))
        return " ".join(WORDS[int(i)] for i in picks)

    @property
    def prompt_tokens(self) -> int:
        """Tokens of the whole prompt: text and images."""
        return self.input_tokens + self.image_tokens

    def image_urls(self) -> tuple[str, ...]:
        """The request's images as PNG data URLs, unique to the request and image."""
        return tuple(png_data_url(self.image_width, self.image_height,
                                  (self.index * 64 + j) & 0xFFFFFF)
                     for j in range(self.images))


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(
        ">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


@lru_cache(maxsize=8)
def _gray_rows(width: int, height: int) -> tuple[bytes, int]:
    """The raw deflate of every row but the last (a full flush: what follows compresses on its
    own), and their Adler-32."""
    rows = (b"\x00" + b"\x80" * (3 * width)) * (height - 1)
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    return c.compress(rows) + c.flush(zlib.Z_FULL_FLUSH), zlib.adler32(rows)


def png_data_url(width: int, height: int, key: int) -> str:
    """An RGB PNG of width x height px, gray but for the last row's first pixel (colour `key`,
    24 bits), as a data URL; built from the cached gray rows, so each costs one row."""
    head, adler = _gray_rows(width, height)
    last = b"\x00" + key.to_bytes(3, "big") + b"\x80" * (3 * (width - 1))
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    idat = (b"\x78\xda" + head + c.compress(last) + c.flush()
            + struct.pack(">I", zlib.adler32(last, adler) & 0xFFFFFFFF))
    png = (b"\x89PNG\r\n\x1a\n"
           + _png_chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
           + _png_chunk(b"IDAT", idat) + _png_chunk(b"IEND", b""))
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def plan_has_images(plan: dict[str, Any]) -> bool:
    """Whether a plan's lanes carry images."""
    return any(int(ln.get("images_per_request") or 0) for ln in plan.get("lanes") or [])


def check_client_sends_images(plan: dict[str, Any], client: str) -> None:
    """Refuse a dataset format that cannot carry the plan's images (one line, exit 2)."""
    if client == "capplan" or not plan_has_images(plan):
        return
    how = {"vllm": "vllm bench serve's custom dataset reads a prompt only; the plan's verify "
                   "line makes the images itself (--dataset-name random-mm, no file)",
           "sglang": "bench_serving's ShareGPT file carries text only; the plan's verify line "
                     "makes the images itself (--dataset-name image, no file)"}
    raise InputError(f"--client {client}: the plan's prompts carry images and "
                     + how.get(client, "its dataset format carries none")
                     + "; write --client capplan (capplan verify --endpoint URL sends them)")


def disaggregated_layout(plan: dict[str, Any]) -> dict[str, Any] | None:
    """The disaggregated layout a plan verifies: the one its plan file names
    (`fixed_disaggregated`), else the one `recommend --disagg` sized (`disaggregated`)."""
    fixed = plan.get("fixed_disaggregated") or {}
    if fixed.get("pools"):
        return fixed
    sized = plan.get("disaggregated") or {}
    return sized if sized.get("prefill") else None


def day_peak(plan: dict[str, Any]) -> dict[str, Any] | None:
    """A day plan's peak window (JSON `day.peak`: its start and end, rate and lanes there),
    None for a plan at one rate."""
    return (plan.get("day") or {}).get("peak") or None


def verified_lanes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    """The lanes verify draws requests from: a plan's at one rate as planned; a day plan's
    (lanes with `rate_curve` or `trace`, no `rate_per_s`) at its peak window, with the rate,
    arrival process and burstiness its recommendation was sized for (`day.peak`)."""
    lanes = plan.get("lanes") or []
    if all(ln.get("rate_per_s") is not None for ln in lanes):
        return lanes
    at = (day_peak(plan) or {}).get("lanes") or []
    if len(at) != len(lanes):
        raise InputError("the plan's lanes follow a day (rate_curve or trace) but the plan "
                         "has no peak window (day.peak): export it again with `capplan plan "
                         "FILE --export PLAN.json`")
    return [{**ln, **peak} for ln, peak in zip(lanes, at, strict=True)]


def plan_rate(plan: dict[str, Any]) -> float:
    """A plan's whole rate (req/s): its lanes' sum (a day plan's at its peak window), what a
    disaggregated layout's front end takes."""
    return sum(float(ln["rate_per_s"]) for ln in verified_lanes(plan))


def plan_requests(plan: dict[str, Any], *, num_requests: int | None = None, seed: int = 0,
                  trace: str | Path | None = None, layout: str = "aggregated"
                  ) -> list[PlannedRequest]:
    """One replica's requests of the plan's best recommendation (a `plan --format json` dict);
    `layout` "disaggregated": the whole workload, which the P/D layout's front end takes."""
    recs = plan.get("recommendations") or []
    if not recs or not plan.get("lanes"):
        raise InputError("the plan has no recommendation or no lanes: pass the JSON that "
                         "`capplan plan FILE --export PLAN.json` writes")
    lanes = verified_lanes(plan)
    best = recs[0]
    replicas = max(1, int(best.get("replicas", 1)))
    rate = best["per_replica_rate_per_s"]
    if layout == "disaggregated":
        if not disaggregated_layout(plan):
            raise InputError("--layout disaggregated: the plan has no disaggregated layout "
                             "(name one in the plan file, or plan with `recommend` or "
                             "`plan --disagg`)")
        replicas, rate = 1, plan_rate(plan)
    max_len = int(best.get("max_model_len") or 1 << 30)
    if trace is not None:
        reqs = load_trace(trace)
        keep = np.arange(len(reqs)) % replicas == 0
        names = ["trace"]
    else:
        reqs, names = _generated(lanes, replicas, num_requests or num_prompts(rate), seed)
        keep = np.ones(len(reqs), bool)
    reqs, _ = reqs.clip_to_context(max_len)
    idx = np.flatnonzero(keep)
    if num_requests and trace is not None:
        idx = idx[:num_requests]
    t0 = float(reqs.arrival_at_s[idx[0]]) if idx.size else 0.0
    images = _lane_images(plan) if trace is None else {}
    return [PlannedRequest(float(reqs.arrival_at_s[i]) - t0, int(reqs.input_tokens[i]),
                           int(reqs.output_tokens[i]),
                           names[int(reqs.lane[i])] if len(names) > 1 else names[0],
                           index=seed * 1_000_003 + k,
                           **images.get(names[int(reqs.lane[i])], {}))
            for k, i in enumerate(idx)]


def _lane_images(plan: dict[str, Any]) -> dict[str, dict[str, int]]:
    """PlannedRequest's image fields by lane name, for the lanes with images."""
    from capplan.plan.schema import Lane

    size = {k: Lane.model_fields[k].default for k in ("image_width", "image_height")}
    return {ln["name"]: {"images": int(ln["images_per_request"]),
                         "image_width": int(ln.get("image_width") or size["image_width"]),
                         "image_height": int(ln.get("image_height") or size["image_height"]),
                         "image_tokens": int(ln.get("image_tokens_per_request") or 0)}
            for ln in plan.get("lanes") or [] if int(ln.get("images_per_request") or 0)}


def _lengths(lane: dict[str, Any]) -> tuple[LengthDist, LengthDist]:
    """A lane's prompt and output length distributions; a day plan's trace lane has its
    trace's, the sample its peak plan was sized with (day_peak.length_sample)."""
    if not lane.get("trace"):
        return parse_length(str(lane["input_len"])), parse_length(str(lane["output_len"]))
    from capplan.plan.day_peak import length_sample

    path = Path(lane["trace"])
    if not path.is_file():
        raise InputError(f"{path}: no such trace file (lane {lane['name']} of the day plan "
                         "draws its lengths from it)")
    inp, out = length_sample(load_trace(path, lane.get("time_unit") or "auto"))
    return (LengthDist("empirical", values=tuple(int(x) for x in inp), text=f"{path} prompts"),
            LengthDist("empirical", values=tuple(int(x) for x in out), text=f"{path} outputs"))


def _generated(lanes: list[dict[str, Any]], replicas: int, n: int, seed: int
               ) -> tuple[Any, list[str]]:
    """`n` requests of the lanes at one replica's share of their rates, and the lanes'
    names."""
    sim = tuple(SimLane(name=ln["name"], rate_per_s=ln["rate_per_s"] / replicas,
                        arrival=ln.get("arrival", "poisson"),
                        burstiness=ln.get("burstiness", 1.0),
                        input_len=inp, output_len=out, priority=ln.get("priority", 0))
                for ln in lanes for inp, out in [_lengths(ln)])
    reqs = Workload(sim, num_requests=n).generate(np.random.default_rng(seed))
    return reqs, [ln.name for ln in sim]


def _rows(client: str, reqs: list[PlannedRequest]) -> str:
    if client == "sglang":  # ShareGPT: the reply's length sets max_tokens (bench_serving)
        return json.dumps([{"id": str(i), "conversations": [
            {"from": "human", "value": r.prompt},
            {"from": "gpt", "value": WORD * max(1, r.output_tokens)}]}
            for i, r in enumerate(reqs)]) + "\n"
    lines = []
    for r in reqs:
        if client == "vllm":  # CustomDataset: prompt + output_tokens per line
            row: dict[str, Any] = {"prompt": r.prompt, "output_tokens": r.output_tokens}
        elif client == "aiperf":  # mooncake_trace: timestamp in ms, lengths in tokens
            row = {"timestamp": round(r.arrival_s * 1e3), "input_length": r.input_tokens,
                   "output_length": r.output_tokens}
        elif client == "guidellm":
            row = {"prompt": r.prompt, "prompt_tokens_count": r.input_tokens,
                   "output_tokens_count": r.output_tokens}
        else:  # capplan's own: everything
            row = {"arrival_s": round(r.arrival_s, 6), "lane": r.lane,
                   "input_tokens": r.input_tokens, "output_tokens": r.output_tokens,
                   "prompt": r.prompt}
            if r.images:
                row.update(image_tokens=r.image_tokens, images=list(r.image_urls()))
        lines.append(json.dumps(row))
    return "\n".join(lines) + "\n"


def write_dataset(path: str | Path, client: str, reqs: list[PlannedRequest]) -> Path:
    """Write the requests in the client's dataset format (atomic)."""
    path = Path(path)
    atomic_write_text(path, _rows(client, reqs))
    return path
