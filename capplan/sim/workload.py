"""Workloads for the simulator: length distributions, lanes, arrivals, trace files.

All randomness comes from an `np.random.Generator` passed in, so a seed fixes the workload.
Arrival processes follow `vllm bench serve`: Poisson, or gamma inter-arrival times with shape
`burstiness` and scale `1 / (rate * burstiness)` (mean 1/rate; burstiness 1 is Poisson, < 1 is
burstier). References: vLLM `benchmarks/serve.py` (`get_request`).
"""

from __future__ import annotations

import csv
import itertools
import json
import math
import re
from array import array
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

import numpy as np

from capplan.errors import InputError, shown_key
from capplan.limits import SIM_HORIZON_S, TOKENS, check_input_file, named_decode_errors
from capplan.models.prefix import NO_PREFIX, PrefixSpec
from capplan.models.queueing import Z99


@dataclass(frozen=True)
class LengthDist:
    """A token-length distribution: fixed, uniform, lognormal (mean, p99) or empirical."""

    kind: str
    params: tuple[float, ...] = ()
    values: tuple[int, ...] = field(default=(), repr=False)
    text: str = ""

    @property
    def mean(self) -> float:
        """Mean length in tokens (before rounding to integers >= 1)."""
        if self.kind == "fixed":
            return self.params[0]
        if self.kind == "uniform":
            return (self.params[0] + self.params[1]) / 2
        if self.kind == "lognormal":
            return self.params[0]
        return float(np.mean(self.values))

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """n integer lengths >= 1 (int64)."""
        if self.kind == "fixed":
            x = np.full(n, self.params[0])
        elif self.kind == "uniform":
            x = rng.integers(int(self.params[0]), int(self.params[1]) + 1, size=n)
        elif self.kind == "lognormal":
            mean, p99 = self.params[:2]
            sigma = lognormal_sigma(mean, p99)
            mu = math.log(mean) - sigma * sigma / 2
            x = np.rint(rng.lognormal(mu, sigma, size=n))
        else:
            x = rng.choice(np.asarray(self.values), size=n)
        return np.maximum(np.asarray(x, dtype=np.int64), 1)


def lognormal_sigma(mean: float, p99: float) -> float:
    """Sigma of a lognormal with the given mean and 99th percentile.

    p99 / mean = exp(z sigma - sigma^2 / 2) with z = 2.326; the smaller root
    sigma = z - sqrt(z^2 - 2 ln(p99/mean)) (the larger one gives a degenerate heavy tail).
    """
    if p99 < mean:
        raise InputError(f"lognormal p99={p99:g} is below mean={mean:g}: p99 must be >= mean")
    r = math.log(p99 / mean)
    disc = Z99 * Z99 - 2 * r
    if disc < 0:
        raise InputError(f"lognormal p99/mean={p99 / mean:.3g} exceeds exp(z^2/2)="
                         f"{math.exp(Z99 * Z99 / 2):.3g}: no lognormal has it; lower p99")
    return Z99 - math.sqrt(disc)


def _kv_params(text: str, body: str, names: tuple[str, ...]) -> dict[str, float]:
    out: dict[str, float] = {}
    for part in body.split(","):
        if "=" not in part:
            raise InputError(f"length {text!r}: expected {'=..,'.join(names)}=..")
        k, v = (p.strip() for p in part.split("=", 1))
        if k not in names:
            raise InputError(f"length {text!r}: unknown parameter {k!r}, expected {names}")
        try:
            out[k] = float(v)
        except ValueError:
            raise InputError(f"length {text!r}: {k}={v!r} is not a number") from None
        out[k] = float(TOKENS.check(out[k], f"length {text!r}: {k}"))
    missing = [n for n in names if n not in out]
    if missing:
        raise InputError(f"length {text!r}: missing {', '.join(missing)}")
    return out


def parse_length(text: str | int | float) -> LengthDist:
    """'800', 'uniform:min=100,max=1000', 'lognormal:mean=800,p99=4000' or 'empirical:PATH'."""
    s = str(text).strip()
    kind, _, body = s.partition(":")
    if not body:
        try:
            x = float(s)
        except ValueError:
            raise InputError(f"length {s!r}: expected a number or uniform:/lognormal:/"
                             f"empirical: distribution") from None
        x = float(TOKENS.check(x, f"length {s!r}"))
        if x != round(x):  # a fixed count of tokens; a distribution's parameters may be real
            raise InputError(f"length {s!r}: a token count is a whole number (e.g. "
                             f"{math.floor(x)} or {math.ceil(x)}); a distribution's mean may "
                             "be fractional (lognormal:mean=..,p99=..)")
        return LengthDist("fixed", (float(x),), text=s)
    kind = kind.strip().lower()
    if kind == "uniform":
        p = _kv_params(s, body, ("min", "max"))
        if p["max"] < p["min"]:
            raise InputError(f"length {s!r}: max must be >= min")
        return LengthDist("uniform", (p["min"], p["max"]), text=s)
    if kind == "lognormal":
        p = _kv_params(s, body, ("mean", "p99"))
        lognormal_sigma(p["mean"], p["p99"])
        return LengthDist("lognormal", (p["mean"], p["p99"]), text=s)
    if kind == "empirical":
        return LengthDist("empirical", values=_read_empirical(body.strip()), text=s)
    raise InputError(f"length {s!r}: unknown distribution {kind!r} "
                     f"(fixed number, uniform, lognormal, empirical)")


def _split_empirical(body: str) -> tuple[Path, str | None]:
    """'FILE' or 'FILE:COLUMN' (a path may hold ':' itself: an existing file wins)."""
    path, sep, col = body.rpartition(":")
    if Path(body).exists() or not sep or not path:
        return Path(body), None
    return Path(path), col.strip()


def _column_index(header: list[str] | None, width: int, col: str | None, path: Path) -> int:
    """The column to read: the one named (by header name or 1-based number); a file of one
    column needs no name; a wider file without one is refused with its columns listed."""
    names = [h.strip() for h in header] if header else [str(i + 1) for i in range(width)]
    if col is None:
        if width == 1:
            return 0
        shown = ", ".join(shown_key(n) for n in names[:12])
        raise InputError(f"{path} has {width} columns ({shown}): name the one to read, "
                         f"empirical:{path}:COLUMN")
    if col in names:
        return names.index(col)
    if col.isdigit() and 1 <= int(col) <= width:
        return int(col) - 1
    shown = ", ".join(shown_key(n) for n in names[:12])
    raise InputError(f"{path}: no column {shown_key(col)} (columns: {shown})")


def _is_number(cell: str) -> bool:
    try:
        float(cell)
    except ValueError:
        return False
    return True


def _read_empirical(body: str) -> tuple[int, ...]:
    """Lengths from one column of a CSV (`empirical:FILE[:COLUMN]`): a header line is
    recognised by a cell that is not a number; every value is a token length within TOKENS.
    A cell of the file is never echoed (`empirical:/etc/shadow` would print a line)."""
    p, col = _split_empirical(body)
    check_input_file(p, "file (empirical length distribution)")
    vals: list[int] = []
    idx: int | None = None
    try:
        with named_decode_errors(p), p.open(newline="", encoding="utf-8-sig") as f:
            for i, row in enumerate(csv.reader(f), 1):
                if not row or not any(c.strip() for c in row):
                    continue
                if idx is None:
                    header = None if all(_is_number(c) for c in row) else row
                    idx = _column_index(header, len(row), col, p)
                    if header is not None:
                        continue
                vals.append(_length_cell(row, idx, p, i))
    except csv.Error as e:
        raise InputError(f"{p}: not a CSV of lengths ({e})") from None
    if not vals:
        raise InputError(f"{p}: no lengths (one integer per line expected)")
    return tuple(vals)


def _length_cell(row: list[str], idx: int, p: Path, line: int) -> int:
    cell = row[idx].strip() if idx < len(row) else ""
    try:
        v = float(cell)
    except ValueError:
        raise InputError(f"{p}:{line}: column {idx + 1} is not a number") from None
    return int(round(TOKENS.check(v, f"{p}:{line}: length")))


@dataclass(frozen=True)
class Lane:
    """One class of traffic: its arrival process, lengths, priority and SLOs."""

    name: str = "default"
    rate_per_s: float | None = None
    arrival: str = "poisson"
    burstiness: float = 1.0
    input_len: LengthDist = field(default_factory=lambda: parse_length(512))
    output_len: LengthDist = field(default_factory=lambda: parse_length(256))
    priority: int = 0
    """Lower is more important (vLLM's priority scheduling)."""
    ttft_slo_s: float | None = None
    tpot_slo_s: float | None = None
    prefix: PrefixSpec = NO_PREFIX
    """How its prompts share content (models/prefix.py): a shared prefix, multi-turn sessions
    or an explicit hit rate."""


@dataclass(frozen=True)
class Requests:
    """Concrete requests, sorted by arrival (open loop) or in sending order (closed loop)."""

    arrival_at_s: np.ndarray
    input_tokens: np.ndarray
    output_tokens: np.ndarray
    lane: np.ndarray
    """Index into the workload's lanes."""
    concurrency: int | None = None
    """Closed loop: the first C arrive at 0, each later one when a request completes (plus the
    engine run's `request_overhead_s`), in order, as `vllm bench serve --max-concurrency C`."""
    note: str = ""
    """Where a trace's requests came from: the columns and time unit used."""
    prefix_group: np.ndarray | None = None
    """Content shared between requests: request i's first `prefix_tokens[i]` tokens (prompt,
    then output) are the content of group `prefix_group[i]` (-1: none), the same in every
    request of the group up to the shorter one (a system prompt; a session's history)."""
    prefix_tokens: np.ndarray | None = None
    hash_ids: tuple[np.ndarray, ...] | None = None
    """A trace's chained block hashes (Mooncake `hash_ids`): id m names the content of prompt
    tokens [0, (m + 1) * hash_block_tokens)."""
    hash_block_tokens: int = 512
    adapter: np.ndarray | None = None
    """Each request's LoRA adapter (ids from 0; -1: the base model). None: a LoRA engine draws
    them from its adapters' popularity (capplan.sim.compiled.adapters_of)."""

    def __len__(self) -> int:
        return len(self.input_tokens)

    @property
    def has_prefix(self) -> bool:
        return self.hash_ids is not None or (
            self.prefix_group is not None and bool((self.prefix_group >= 0).any()))

    def block_keys(self, i: int, block_size: int) -> list:
        """Keys of request i's full KV blocks whose content other requests can share, in
        order (vLLM hashes a full block chained from its parent, so a key names the content of
        every token up to the block's end: (content id, end token)). Blocks past the shared
        content get none."""
        if self.hash_ids is not None:
            ids, g = self.hash_ids[i], self.hash_block_tokens
            limit = min(len(ids) * g, int(self.input_tokens[i]))
            return [(int(ids[(e - 1) // g]), e) for e in range(block_size, limit + 1, block_size)]
        if self.prefix_group is None or self.prefix_tokens is None or self.prefix_group[i] < 0:
            return []
        grp, limit = int(self.prefix_group[i]), int(self.prefix_tokens[i])
        return [(-1 - grp, e) for e in range(block_size, limit + 1, block_size)]

    def clip_to_context(self, max_model_len: int) -> tuple[Requests, int]:
        """Requests whose prompt plus output exceed max_model_len get their prompt cut to fit
        (vLLM refuses longer ones; benchmark clients truncate). Returns (requests, n_clipped).
        Raises InputError when the output alone does not fit."""
        inp, out = clip_lengths(self.input_tokens, self.output_tokens, max_model_len)
        n = int(np.count_nonzero(inp != self.input_tokens))
        pt = self.prefix_tokens
        if pt is not None:  # a cut prompt keeps its start: its shared part ends at the cut
            cut = inp != self.input_tokens
            pt = np.where(cut, np.minimum(pt, inp), pt)
        return Requests(self.arrival_at_s, inp, out, self.lane, self.concurrency, self.note,
                        self.prefix_group, pt, self.hash_ids, self.hash_block_tokens,
                        self.adapter), n


def clip_lengths(inp: np.ndarray, out: np.ndarray, max_model_len: int
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Cut prompts so that prompt + output <= max_model_len; see Requests.clip_to_context."""
    inp, out = np.asarray(inp), np.asarray(out)
    if out.size and int(out.max()) >= max_model_len:
        raise InputError(f"an output length of {int(out.max())} tokens leaves no room for a "
                         f"prompt within max_model_len {max_model_len}: raise --max-model-len "
                         "or shorten --output-len")
    fixed = inp.size and int(inp.min()) == int(inp.max()) and int(out.min()) == int(out.max())
    if fixed and int(inp[0] + out[0]) > max_model_len:
        raise InputError(f"input {int(inp[0])} + output {int(out[0])} tokens exceed "
                         f"max_model_len {max_model_len}, which vLLM refuses: raise "
                         "--max-model-len (up to the model's limit) or shorten the requests")
    return np.minimum(inp, max_model_len - out).astype(inp.dtype), out


@dataclass(frozen=True)
class Workload:
    """Open loop (lanes with rates), closed loop (concurrency) or a trace."""

    lanes: tuple[Lane, ...]
    num_requests: int = 1000
    concurrency: int | None = None
    trace: Requests | None = None

    def generate(self, rng: np.random.Generator) -> Requests:
        """Draw the requests (lengths, lanes, arrival times) from `rng`."""
        if self.trace is not None:
            return self.trace
        _validate(self)
        n = self.num_requests
        session = np.full(n, -1, np.int64)
        """Multi-turn lanes: each request's session (-1 otherwise), turns in arrival order."""
        if self.concurrency is not None:
            w = np.array([ln.rate_per_s or 1.0 for ln in self.lanes], float)
            lane = rng.choice(len(self.lanes), size=n, p=w / w.sum()) if len(self.lanes) > 1 \
                else np.zeros(n, np.int64)
            arr = np.zeros(n)
            for i, ln in enumerate(self.lanes):  # a client's consecutive turns form a session
                if ln.prefix.turns > 1:
                    rows = np.flatnonzero(lane == i)
                    session[rows] = n * i + np.arange(len(rows)) // ln.prefix.turns
        else:
            times, lanes, sessions = [], [], []
            for i, ln in enumerate(self.lanes):
                t_i, s_i = _lane_arrivals(rng, ln, n)
                times.append(t_i)
                lanes.append(np.full(len(t_i), i))
                sessions.append(np.where(s_i >= 0, n * i + s_i, -1))
            t, lane_all = np.concatenate(times), np.concatenate(lanes)
            order = np.argsort(t, kind="stable")[:n]
            arr, lane = t[order], lane_all[order]
            session = np.concatenate(sessions)[order]
        inp = np.empty(n, np.int64)
        out = np.empty(n, np.int64)
        group = np.full(n, -1, np.int64)
        shared = np.zeros(n, np.int64)
        for i, ln in enumerate(self.lanes):
            m = lane == i
            k = int(m.sum())
            inp[m] = ln.input_len.sample(rng, k)
            out[m] = ln.output_len.sample(rng, k)
            if ln.prefix.active:
                rows, g, sh = _lane_prefix(ln.prefix, i, rng, np.flatnonzero(m), session, inp,
                                           out)
                group[rows], shared[rows] = g, sh
        if not (group >= 0).any():
            return Requests(arr, inp, out, np.asarray(lane, np.int64), self.concurrency)
        return Requests(arr, inp, out, np.asarray(lane, np.int64), self.concurrency,
                        prefix_group=group, prefix_tokens=shared)


def _lane_arrivals(rng: np.random.Generator, ln: Lane, n: int) -> tuple[np.ndarray, np.ndarray]:
    """n arrival times of a lane, and each one's session (-1: single requests).

    A multi-turn lane's sessions start at rate / turns (so requests arrive at the lane's rate)
    and turn k + 1 arrives think_s after turn k (open loop: whether or not turn k finished)."""
    t = ln.prefix.turns
    if t <= 1:
        return arrival_times(rng, ln.rate_per_s or 0.0, n, ln.arrival, ln.burstiness), \
            np.full(n, -1, np.int64)
    starts = arrival_times(rng, (ln.rate_per_s or 0.0) / t, -(-n // t), ln.arrival,
                           ln.burstiness)
    times = (starts[:, None] + ln.prefix.think_s * np.arange(t)).ravel()
    sess = np.repeat(np.arange(len(starts)), t)
    return times[:n], sess[:n]


def _lane_prefix(spec: PrefixSpec, lane: int, rng: np.random.Generator, idx: np.ndarray,
                 session: np.ndarray, inp: np.ndarray, out: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray | int, np.ndarray]:
    """Shared content of one lane's requests (rows `idx`, in arrival order): (rows, their
    content group, their shared tokens); a multi-turn lane's prompts grow in place.

    shared prefix: a fraction share_frac (drawn per request) starts with the lane's
    shared_tokens (part of its prompt: the lane's input length is the whole prompt).
    multi-turn: a session's turn k prompt resends turns 1..k-1 (prompts and answers) before its
    new message (the lane's input length), and the whole session is one content group.
    hit rate: every request of the lane shares its first h * prompt tokens with the lane's
    common content (a corpus read by all), so a request finds them once a longer one ran.
    """
    if spec.shared_tokens > 0 and spec.share_frac > 0:
        sel = idx[rng.random(len(idx)) < spec.share_frac]
        return sel, lane, np.minimum(spec.shared_tokens, inp[sel])
    if spec.turns > 1:
        rows = idx[session[idx] >= 0]
        sid = session[rows]
        order = rows[np.lexsort((rows, sid))]  # by session, turns in arrival order
        s_sorted = session[order]
        uo = inp[order] + out[order]
        cs = np.cumsum(uo)
        first = np.r_[True, s_sorted[1:] != s_sorted[:-1]]
        base = np.maximum.accumulate(np.where(first, cs - uo, 0))
        done = cs - uo - base  # tokens of the session's earlier turns
        inp[order] += done
        # a session's group id never equals a lane's own (< number of lanes)
        return order, s_sorted + 1_000_000_000 * (lane + 1), inp[order] + out[order]
    return idx, lane, np.floor((spec.hit_rate or 0.0) * inp[idx]).astype(np.int64)


def _validate(w: Workload) -> None:
    if not w.lanes:
        raise InputError("workload has no lanes")
    if not isinstance(w.num_requests, int | np.integer) or w.num_requests < 1:
        raise InputError(f"--requests {w.num_requests}: must be a positive integer")
    if w.concurrency is not None and w.concurrency < 1:
        raise InputError(f"--concurrency {w.concurrency}: must be a positive integer")
    for ln in w.lanes:
        r = ln.rate_per_s
        if r is not None and (not math.isfinite(r) or r <= 0):
            raise InputError(f"lane {ln.name}: rate {r} must be a finite number > 0")
        if r is None and w.concurrency is None:
            raise InputError(f"lane {ln.name}: an open-loop workload needs a rate")
        if ln.arrival not in ("poisson", "gamma"):
            raise InputError(f"lane {ln.name}: arrival {ln.arrival!r} must be poisson or gamma")
        if not math.isfinite(ln.burstiness) or ln.burstiness <= 0:
            raise InputError(f"lane {ln.name}: burstiness {ln.burstiness} must be > 0")


def arrival_times(rng: np.random.Generator, rate_per_s: float, n: int, arrival: str = "poisson",
                  burstiness: float = 1.0) -> np.ndarray:
    """n arrival times (s) from 0: exponential or gamma(shape=b, scale=1/(rate*b)) gaps."""
    if not math.isfinite(rate_per_s) or rate_per_s <= 0:
        raise InputError(f"rate {rate_per_s}: must be a finite number > 0")
    shape = 1.0 if arrival == "poisson" else burstiness
    gaps = rng.gamma(shape, 1.0 / (rate_per_s * shape), size=n)
    return np.cumsum(gaps)


# ---------------------------------------------------------------------------------------------
# Traces
# Column names of the public trace formats, in order of preference:
#  Azure LLM inference traces: TIMESTAMP (datetime), ContextTokens, GeneratedTokens
#  Vidur processed traces (microsoft/vidur data/processed_traces): arrived_at (s),
#    num_prefill_tokens, num_decode_tokens
#  BurstGPT (HPMLL/BurstGPT README "Schema"): Timestamp (s from 0:00 of the first day),
#    Request tokens, Response tokens
#  Mooncake (kvcache-ai/Mooncake FAST25-release/README.md): timestamp (relative, in
#    milliseconds), input_length, output_length, hash_ids
ARRIVAL_COLUMNS = ("arrival_time_s", "arrived_at", "timestamp", "Timestamp", "TIMESTAMP")
INPUT_COLUMNS = ("input_tokens", "prompt_tokens", "ContextTokens", "num_prefill_tokens",
                 "Request tokens", "input_length")
OUTPUT_COLUMNS = ("output_tokens", "GeneratedTokens", "num_decode_tokens", "Response tokens",
                  "output_length")
TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6}
_UNIT_S = {**TIME_UNITS, "ns": 1e-9}
"""Seconds per unit of the units a trace's arrival times may be in (ns only when the column's
name states it)."""
_MOONCAKE = {"timestamp", "input_length", "output_length"}
_NAMED_UNITS = {**dict.fromkeys(("s", "sec", "secs", "second", "seconds"), "s"),
                **dict.fromkeys(("ms", "msec", "millis", "millisecond", "milliseconds"), "ms"),
                **dict.fromkeys(("us", "usec", "micros", "microsecond", "microseconds"), "us"),
                **dict.fromkeys(("ns", "nsec", "nanos", "nanosecond", "nanoseconds"), "ns")}
"""A column name's last word that states its time unit (`arrival_time_s`, `timestamp_ms`)."""


def unit_from_name(column: str) -> str | None:
    """The time unit a column's name states by its last word after an underscore, a space, a
    dot or a parenthesis (`arrival_time_s` -> s, `timestamp_ms` -> ms, `time (us)` -> us);
    None when it states none (`timestamp`, `arrived_at`)."""
    words = [w for w in re.split(r"[_\s.()\[\]-]+", column.strip().lower()) if w]
    return _NAMED_UNITS.get(words[-1]) if len(words) > 1 else None


def _arrival_column(cols: list[str], path: Path) -> str:
    """The arrival-time column: one of ARRIVAL_COLUMNS, else one of their bases (arrival_time,
    arrived_at, timestamp) with a unit suffix (`timestamp_ms`, `arrival_time_us`)."""
    for c in ARRIVAL_COLUMNS:
        if c in cols:
            return c
    bases = ("arrival_time", "arrived_at", "timestamp")
    for c in cols:
        unit = unit_from_name(c)
        if unit and any(c.lower().startswith(b) and len(c) > len(b) for b in bases):
            return c
    raise InputError(f"{path}:1: no arrival time column; expected one of "
                     f"{', '.join(ARRIVAL_COLUMNS)} (or with a unit suffix: timestamp_ms)")


# Numeric stamps larger than this instant once read in a unit are epoch stamps in that unit.
_EPOCH_FLOOR_S = datetime(2001, 1, 1, tzinfo=UTC).timestamp()


def trace_time_unit(cols: list[str], times: np.ndarray, column: str = "") -> tuple[str, str]:
    """(unit, why) for numeric arrival times: the unit the arrival column's name states
    (unit_from_name: `arrival_time_s` is in seconds whatever its values); else Mooncake's
    schema is in milliseconds; epoch stamps are recognised by size (in us or ms they would lie
    after 2001 only when read in that unit); anything else is seconds unless its span says
    milliseconds (_unit_from_span)."""
    named = unit_from_name(column)
    if named is not None:
        return named, f"the column's name says {named}"
    if _MOONCAKE <= set(cols):
        return "ms", "Mooncake trace: timestamp in milliseconds"
    t0 = float(np.nanmin(times)) if times.size else 0.0
    for unit, name in (("us", "epoch microseconds"), ("ms", "epoch milliseconds")):
        if t0 * TIME_UNITS[unit] > _EPOCH_FLOOR_S:
            return unit, name
    return _unit_from_span(times)


def arrival_rate(n: int, span_s: float) -> float:
    """The one rate capplan reads arrivals at: n requests from the first arrival to the last
    are n - 1 gaps over the span, so (n - 1) / span (the mean gap's inverse; an open loop
    drawn at rate r gives it back, its first arrival at 0 and n - 1 gaps of mean 1 / r). The
    day planner's windows count the same way: a window holds the arrivals after its start up
    to its end, the first arrival only opening the trace's clock (plan/rate_curve.py)."""
    return (n - 1) / span_s


def replayable_rate(arrivals: Any, source: str) -> float:
    """arrival_rate of a trace's arrivals; InputError when it has no rate: fewer than two
    requests, or all at one instant (`latency`, `simulate`, `recommend` and day plans refuse
    such a trace alike)."""
    t = np.asarray(arrivals, float)
    span = float(t.max() - t.min()) if len(t) else 0.0
    if len(t) < 2 or not span > 0:
        raise InputError(f"{source}: needs at least two requests at different times")
    return arrival_rate(len(t), span)


MIN_TRACE_RATE_PER_S = 0.01
"""Slowest mean rate a serving trace is read at in seconds when its stamps are whole numbers
(36 requests an hour; BurstGPT, the sparsest public trace, averages ~0.13 req/s): below it,
whole-number stamps are read as milliseconds, as Mooncake-style traces whose columns were
renamed carry them (read as seconds they gave 0.003 req/s, 1000x slow)."""


def _unit_from_span(times: np.ndarray) -> tuple[str, str]:
    """(unit, why) for relative stamps: seconds, unless every stamp is a whole number and the
    span read in seconds puts the mean rate below MIN_TRACE_RATE_PER_S while milliseconds give
    a rate a server sees (at most 1e6 req/s, limits.RATE_PER_S)."""
    n = int(times.size)
    span = float(np.nanmax(times)) - float(np.nanmin(times)) if n else 0.0  # inf, no warning
    if n < 2 or not 0 < span < math.inf or not bool(np.all(times == np.floor(times))):
        return "s", "seconds"
    rate_s = arrival_rate(n, span)
    if rate_s < MIN_TRACE_RATE_PER_S and rate_s * 1e3 <= 1e6:
        return "ms", (f"whole-number stamps spanning {span:.4g}: {rate_s:.2g} req/s in seconds, "
                      f"{rate_s * 1e3:.3g} req/s in milliseconds; --time-unit s to override")
    return "s", "seconds"


def _pick(cols: list[str], names: tuple[str, ...], path: Path, what: str) -> str:
    for n in names:
        if n in cols:
            return n
    raise InputError(f"{path}:1: no {what} column; expected one of {', '.join(names)}")


def _time_value(v: object, path: Path, line: int) -> float:
    if isinstance(v, int | float) and not isinstance(v, bool):
        x = float(v)
    else:
        s = str(v).strip()
        try:
            x = float(s)
        except ValueError:
            x = _parse_datetime(s, path, line)
    if not math.isfinite(x):
        raise InputError(f"{path}:{line}: arrival time {v!r} is not finite")
    return x


_NAIVE_SEEN: list[int] = []
_AWARE_SEEN: list[int] = []
"""Lines of the trace being read whose datetime had no / a UTC offset (reset per trace)."""


def _parse_datetime(s: str, path: Path, line: int) -> float:
    # Azure LLM traces: "2023-11-16 18:15:46.6805900" (7 fractional digits: keep 6).
    head, dot, frac = s.partition(".")
    try:
        t = datetime.fromisoformat(head.replace("T", " "))
    except ValueError:
        raise InputError(f"{path}:{line}: arrival time {s!r} is neither seconds nor a "
                         f"datetime like 2023-11-16 18:15:46.68") from None
    frac_s = float("0." + frac) if dot and frac.isdigit() else 0.0
    if t.tzinfo is None:  # naive: UTC, not this machine's zone (answers must not move with it)
        t = t.replace(tzinfo=UTC)
        _NAIVE_SEEN.append(line)
    else:
        _AWARE_SEEN.append(line)
    if _NAIVE_SEEN and _AWARE_SEEN:
        raise InputError(f"{path}:{line}: arrival times mix stamps with a UTC offset (line "
                         f"{_AWARE_SEEN[0]}) and without one (line {_NAIVE_SEEN[0]}): give "
                         "every stamp an offset, or none")
    try:
        return t.timestamp() + frac_s
    except (OverflowError, OSError, ValueError):  # year 1: before the platform's epoch range
        raise InputError(f"{path}:{line}: arrival time {s!r} is out of range") from None


def _length_value(v: object, path: Path, line: int, col: str) -> int:
    try:
        x = float(v)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise InputError(f"{path}:{line}: {col} {v!r} is not a number") from None
    if not math.isfinite(x) or x < 0 or x != round(x):
        raise InputError(f"{path}:{line}: {col} {v!r} must be a non-negative integer")
    if x > TOKENS.hi:
        raise InputError(f"{path}:{line}: {col} {int(x)} exceeds {int(TOKENS.hi):,} tokens, "
                         "longer than any model's context")
    return int(x)


def _rows(f: IO[str], path: Path) -> tuple[list[str], Iterator[tuple[int, dict]]]:
    """Column names and a stream of (line, row) from an open trace: rows are read one at a
    time, so a large trace costs its three arrays, not a dict per row held at once."""
    if path.suffix.lower() in (".jsonl", ".json", ".ndjson"):
        def objects() -> Iterator[tuple[int, dict]]:
            for i, ln in enumerate(f, 1):
                if not ln.strip():
                    continue
                try:
                    obj = json.loads(ln)
                except json.JSONDecodeError as e:
                    raise InputError(f"{path}:{i}: not valid JSON ({e.msg})") from None
                if not isinstance(obj, dict):
                    raise InputError(f"{path}:{i}: expected a JSON object per line")
                yield i, obj
        it = objects()
        first = next(it, None)
        if first is None:
            return [], iter(())
        return list(first[1]), itertools.chain([first], it)
    reader = csv.DictReader(f)
    cols = [c.strip() for c in (reader.fieldnames or [])]
    reader.fieldnames = cols
    return cols, ((i, r) for i, r in enumerate(reader, 2))


def _read_trace(p: Path) -> tuple:
    """A trace's rows: (columns, the arrival / input / output columns used, their values as
    arrays (times as read), whether every time is a number, Mooncake hash ids per row)."""
    times, inputs, outputs = array("d"), array("q"), array("q")
    hashes: list[np.ndarray] = []
    numeric = True
    with named_decode_errors(p), open(p, encoding="utf-8-sig", newline="") as f:
        try:
            cols, rows = _rows(f, p)
            if not cols:
                raise InputError(f"{p}: empty trace (no requests)")
            used = (_arrival_column(cols, p),
                    _pick(cols, INPUT_COLUMNS, p, "input tokens"),
                    _pick(cols, OUTPUT_COLUMNS, p, "output tokens"))
            ca, ci, co = used
            for line, r in rows:
                for c in used:
                    if r.get(c) in (None, ""):
                        raise InputError(f"{p}:{line}: missing value for column {c}")
                tk, is_num = _time_and_kind(r[ca], p, line)
                times.append(tk)
                numeric = numeric and is_num
                inputs.append(_length_value(r[ci], p, line, ci))
                outputs.append(_length_value(r[co], p, line, co))
                if "hash_ids" in cols:
                    hashes.append(_hash_ids(r.get("hash_ids"), p, line))
        except csv.Error as e:  # a NUL byte, a field over csv's 128 KiB limit
            raise InputError(f"{p}: not a CSV trace ({e})") from None
    if not times:
        raise InputError(f"{p}: empty trace (no requests)")
    arrays = tuple(np.frombuffer(a, dtype=d).copy()
                   for a, d in ((times, np.float64), (inputs, np.int64), (outputs, np.int64)))
    return cols, used, arrays, numeric, hashes


def load_trace(path: str | Path, time_unit: str = "auto") -> Requests:
    """Requests from a CSV or JSONL trace; arrival times shifted so the first is at 0.

    Columns (first present wins): arrival `arrival_time_s`, `arrived_at` (Vidur), `timestamp`,
    `Timestamp` (BurstGPT) or Azure's `TIMESTAMP` datetime; input `input_tokens`,
    `prompt_tokens`, `ContextTokens`, `num_prefill_tokens`, `Request tokens`, `input_length`;
    output `output_tokens`, `GeneratedTokens`, `num_decode_tokens`, `Response tokens`,
    `output_length`. Numeric times are in seconds unless time_unit says otherwise ("s", "ms",
    "us"); "auto" reads Mooncake traces in milliseconds and recognises epoch stamps
    (trace_time_unit). Lengths of 0 become 1 (every request has a prompt and one token).
    The returned `note` names the columns and unit used.
    """
    p = Path(path)
    if time_unit not in ("auto", *TIME_UNITS):
        raise InputError(f"--time-unit {time_unit!r}: use auto, s, ms or us")
    if not p.is_file():
        raise InputError(f"{p}: no such trace file")
    check_input_file(p, "trace")
    _NAIVE_SEEN.clear()
    _AWARE_SEEN.clear()
    cols, (ca, ci, co), (t, inp, out), numeric, hashes = _read_trace(p)
    if numeric:
        unit, why = ((time_unit, "--time-unit") if time_unit != "auto"
                     else trace_time_unit(cols, t, ca))
        t = t * _UNIT_S[unit]
    else:
        unit, why = "s", "datetimes"
    span = float(t.max()) - float(t.min())  # Python floats: inf without a numpy warning
    if not span <= SIM_HORIZON_S:
        raise InputError(f"{p}: arrival times span {span:.3g} s, past {SIM_HORIZON_S:.1g} s "
                         "(float64 time stamps stop resolving a step)")
    order = np.argsort(t, kind="stable")
    t = t[order] - t[order][0]
    span = float(t[-1]) if len(t) else 0.0
    when = (f"{len(t)} requests over {span:.4g} s ({len(t) - 1} gaps), "
            f"{arrival_rate(len(t), span):.3g} req/s" if span > 0 else
            "1 request" if len(t) == 1 else f"{len(t)} requests at one instant (no rate)")
    note = f"{p}: {when}; columns {ca} ({unit}, {why}), {ci}, {co}"
    hash_ids = tuple(hashes[i] for i in order.tolist()) if hashes else None
    if hash_ids is not None:
        note += f", hash_ids ({MOONCAKE_HASH_BLOCK_TOKENS}-token blocks)"
    return Requests(t, np.maximum(inp[order], 1), np.maximum(out[order], 1),
                    np.zeros(len(t), np.int64), note=note, hash_ids=hash_ids,
                    hash_block_tokens=MOONCAKE_HASH_BLOCK_TOKENS)


MOONCAKE_HASH_BLOCK_TOKENS = 512
"""Tokens per `hash_ids` entry in Mooncake's traces: each id is a remapped hash of a 512-token
block chained from its prefix (technical report arXiv 2407.00079 section 4; the FAST25-release
README sample has 14 ids for 6955 tokens = ceil(6955 / 512))."""


def _hash_ids(v: object, path: Path, line: int) -> np.ndarray:
    """A Mooncake `hash_ids` cell: a JSON list of integers (a list already in JSONL)."""
    if v in (None, ""):
        return np.zeros(0, np.int64)
    try:
        ids = json.loads(v) if isinstance(v, str) else v
        arr = np.asarray(ids, np.int64)
    except (ValueError, TypeError, OverflowError):
        raise InputError(f"{path}:{line}: hash_ids {str(v)[:40]!r} is not a list of "
                         "integers") from None
    if arr.ndim != 1:
        raise InputError(f"{path}:{line}: hash_ids must be a flat list of integers")
    return arr


def trace_prefix_hits(reqs: Requests, block_size: int) -> np.ndarray:
    """Prompt tokens each request of a trace could find cached with an unbounded cache: the
    longest run of its leading full blocks whose content an earlier request had (vLLM's rules:
    full blocks, chained, at most prompt - 1 tokens). An upper bound on the hit; the
    simulator applies the KV cache's size."""
    seen: set = set()
    hits = np.zeros(len(reqs), np.int64)
    for i in range(len(reqs)):
        keys = reqs.block_keys(i, block_size)
        cap = (int(reqs.input_tokens[i]) - 1) // block_size
        n = 0
        for k in keys[:cap]:
            if k not in seen:
                break
            n += 1
        hits[i] = n * block_size
        seen.update(keys)
    return hits


def _time_and_kind(v: object, path: Path, line: int) -> tuple[float, bool]:
    """(value, is_numeric): numbers in the trace's unit, datetimes as epoch seconds."""
    if isinstance(v, int | float) and not isinstance(v, bool):
        return _time_value(v, path, line), True
    try:
        float(str(v).strip())
        return _time_value(v, path, line), True
    except ValueError:
        return _time_value(v, path, line), False
