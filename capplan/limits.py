"""The edge's bounds: every number capplan accepts, and the work one command may do.

Two kinds of limit live here, each with its reason (docs/reliability.md lists them):
- *Bounds* are physical or numerical: a rate, a length, a count outside them is not a question
  the models can answer (a prompt longer than any model's context, a seed numpy refuses, a rate
  whose simulated horizon outruns float64 time stamps). They are fixed; a value outside is bad
  input (exit 2, one line).
- *Caps* bound the work of one command (requests to simulate, rows to compute, bytes to read).
  They are estimates checked before the work starts; `capplan --limit NAME=VALUE` raises one.

CLI ParamTypes (cli/_options.py), plan-file fields (plan/schema.py) and the Python API all check
against these same objects, so the models and the simulator never see a value they cannot
handle.
"""

from __future__ import annotations

import math
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from capplan.errors import InputError
from capplan.units import GB_BYTES, GIGA, KB_BYTES, MB_BYTES, MIB_BYTES


@dataclass(frozen=True)
class Bound:
    """A closed (or left-open) interval for one kind of number, and why."""

    what: str
    lo: float
    hi: float
    reason: str
    lo_open: bool = False
    integer: bool = False
    lo_reason: str | None = None
    """Why the lower end, where `reason` explains only the upper one."""

    def check(self, value: Any, name: str | None = None) -> float:
        """value as a float (an int when `integer`) inside the bound, else InputError."""
        label = f"{self.what if name is None else name}: " if name != "" else ""
        if isinstance(value, bool):  # YAML `true` is not the number 1
            raise InputError(f"{label}{value!r} is not a number")
        try:
            x = float(value)
        except (TypeError, ValueError, OverflowError):
            raise InputError(f"{label}{value!r} is not a number") from None
        if not math.isfinite(x):
            raise InputError(f"{label}{value!r} is not a finite number")
        if self.integer and x != math.floor(x):
            raise InputError(f"{label}{value!r} is not a whole number")
        # whole numbers compared exactly: float(2**63 - 1) rounds up to 2**63, past SEED.hi
        v: float = int(value) if self.integer and isinstance(value, int) else x
        if v < self.lo or (self.lo_open and v == self.lo) or v > self.hi:
            lo = f"> {_num(self.lo)}" if self.lo_open else f">= {_num(self.lo)}"
            why = self.lo_reason if self.lo_reason and v <= self.lo else self.reason
            raise InputError(f"{label}{_num(v)} must be {lo} and <= {_num(self.hi)} ({why})")
        return int(v) if self.integer else x

    def field(self, integer: bool | None = None) -> Any:
        """An Annotated pydantic type for this bound (plan files, typed API): strict (YAML
        `true` is not 1), bounds in the JSON Schema, the reason in the error."""
        from typing import Annotated

        from pydantic import AfterValidator, BeforeValidator, Field

        as_int = self.integer if integer is None else integer
        schema = {"exclusiveMinimum" if self.lo_open else "minimum": self.lo,
                  "maximum": self.hi}
        extra = {} if as_int else {"allow_inf_nan": False}
        to_int = [BeforeValidator(whole)] if as_int else []  # 4096.0: JSON Schema's integer
        return Annotated[int if as_int else float, *to_int,
                         Field(strict=True, json_schema_extra=schema, **extra),
                         AfterValidator(lambda v: type(v)(self.check(v, "")))]


def whole(v: object) -> object:
    """A whole float (4096.0) as the integer JSON Schema takes it for; anything else as given
    (the strict integer check refuses 0.5 and true)."""
    return int(v) if isinstance(v, float) and math.isfinite(v) and v.is_integer() else v


def _num(x: float) -> str:
    """1e+06 -> 1,000,000; 16777216 -> 16,777,216; 1e-06 stays 1e-06."""
    if isinstance(x, int):
        return f"{x:,}"
    if x == math.floor(x) and abs(x) < 1e15:
        return f"{x:,.0f}"
    return f"{x:g}"


# --- bounds ---------------------------------------------------------------------------------
RATE_PER_S = Bound(
    "rate (requests/s)", 1e-6, 1e6, lo_open=False,
    reason="1e6 req/s is ~86 billion requests a day, beyond any published LLM service; below "
           "1e-6 req/s (one request in 11 days) simulated time outruns float64 resolution")
TOKENS = Bound(
    "length (tokens)", 1, 2**24, integer=False,
    reason="16.7M tokens exceeds every catalog model's context (the longest is 10M); each "
           "command then checks the model's own max_model_len")
CONCURRENCY = Bound("concurrency (clients)", 1, 1_000_000, integer=True,
                    reason="a million clients is beyond any engine's max_num_seqs by 1000x")
BATCH = Bound("batch (sequences)", 1, 1_000_000, integer=True,
              reason="vLLM's max_num_seqs is at most a few thousand")
ENGINE_COUNT = Bound("engine limit", 1, 2**24, integer=True,
                     reason="max_num_seqs / max_num_batched_tokens past 16.7M fit no GPU",
                     lo_reason="a count of GPUs, workers, sequences or tokens: at least 1")
PARALLEL = Bound("parallel size", 1, 128, integer=True,
                 reason="the largest NVLink domain is 72 GPUs (GB200 NVL72)")
ENDPOINT_CONCURRENCY = Bound("concurrency (client threads)", 1, 1024, integer=True,
                              reason="one client thread per concurrent request")
PRIORITY = Bound("priority", -1_000_000, 1_000_000, integer=True,
                 reason="an ordering: a million levels is more than any scheduler uses")
ENDPOINT_TOKENS = Bound("tokens per request", 1, 2**20, integer=True,
                        reason="a 1M-token prompt is a 6 MB request body; longer contexts are "
                               "rare and the body is held in memory")
SEED = Bound("seed", 0, 2**63 - 1, integer=True,
             reason="numpy seeds are non-negative 64-bit integers")
BURSTINESS = Bound("burstiness", 1e-3, 1e3,
                   reason="gamma shape; vllm bench serve uses 0.1..10, outside 1e-3..1e3 the "
                          "gaps are all 0 or all equal to float64 precision")
DURATION_S = Bound("duration (s)", 0.0, 86_400.0, lo_open=True,
                   reason="a latency objective or timeout over a day is not a serving SLO")
FRACTION = Bound("fraction", 0.0, 1.0, lo_open=True, reason="a fraction of the GPU memory")
HEADROOM = Bound("headroom", 0.0, 10.0, reason="at most 11x the offered rate")
DEFAULT_HEADROOM = 0.2
"""Spare capacity the planner sizes replicas with by default (replicas = ceil(rate x 1.2 /
capacity)): `recommend --headroom`, plan files' `headroom`, implied P/D prefill workers."""
PRICE_PER_HOUR = Bound("price (USD per GPU-hour)", 0.0, 10_000.0, lo_open=True,
                       reason="no GPU rents for more than $10,000 an hour")
SHARE_FRAC = Bound("fraction of requests", 0.0, 1.0,
                   reason="a share of the requests: 0 (none) to 1 (all)")
HIT_RATE = Bound("prefix hit rate", 0.0, 1.0,
                 reason="a fraction of the prompt tokens: 0 to 1")
TURNS = Bound("turns per session", 1, 1000, integer=True,
              reason="a thousand turns resend a history longer than any context")
THINK_S = Bound("think time (s)", 0.0, 86_400.0,
                reason="a day between turns is a new session, not a cached history")
REQUESTS = Bound("requests", 1, GIGA, integer=True,
                 reason="a billion requests; the sim_requests cap bounds what one run does")
WARMUP_PROMPTS = Bound("warm-up prompts", 0, GIGA, integer=True,
                       reason="a billion requests; warm-up prompts are sent before the measured "
                              "ones")
DURATION_OR_0_S = Bound("duration (s)", 0.0, DURATION_S.hi, reason=DURATION_S.reason)
"""A wait that may be 0 (a batch timeout, a replica's start-up lag)."""
WINDOW_S = Bound("window (s)", 60.0, 4.0e9,
                 reason="a rate is checked over at least a minute of trace; past 4e9 s float64 "
                        "time stamps no longer resolve a millisecond")
REPLICAS = Bound("replicas", 1, 4096, "a fleet simulated on one machine", integer=True)
# Feature options: the same bounds as the plan file's fields (capplan.plan.schema)
SPEC_TOKENS = Bound("draft tokens per step", 0, 16, integer=True,
                    reason="the longest draft the plan file searches; 0 = off")
SPEC_TOPK = Bound("draft tree branching", 1, 16, integer=True,
                  reason="SGLang's documented EAGLE examples use top-k 1-8")
SPEC_DRAFT_TOKENS = Bound("verified tokens per step", 2, 16 * 16 + 1, integer=True,
                          reason="at most draft tokens x branching + 1")
ACCEPTANCE_LENGTH = Bound("acceptance length", 1.0, 16 * 16 + 1.0,
                          reason="tokens per step: 1 + accepted drafts, at most the verified "
                                 "tokens")
MAX_LORAS = Bound("LoRA slots", 0, 1024, integer=True,
                  reason="vLLM --max-loras; 0 = no LoRA")
LORA_RANK = Bound("LoRA rank", 1, 512, integer=True,
                  reason="vLLM's largest --max-lora-rank is 512")
LORA_ADAPTERS = Bound("LoRA adapters", 0, 100_000, integer=True,
                      reason="distinct adapters in the traffic")
IMAGES = Bound("images per request", 0, 64, integer=True,
               reason="vLLM --limit-mm-per-prompt; a prompt of 64 images fills any context")
IMAGE_PIXELS = Bound("image side (pixels)", 1, 16_384, integer=True,
                     reason="16K pixels a side is past every vision encoder's resize limit")
# A model's shape (config.json at `models import`, model YAMLs in the catalog or --catalog-dir):
# each upper end is the largest published figure times a margin, so a typo (10**9 layers hung
# the import; 10**6 imported with absurd sizes) is refused before anything is built per layer.
MODEL_LAYERS = Bound("layers", 1, 1024, integer=True,
                     reason="the deepest published LLM, Llama-3.1-405B, has 126 layers "
                            "(its config.json); 1024 is 8x")
MODEL_WIDTH = Bound("hidden size", 1, 2**17, integer=True,
                    reason="Llama-3.1-405B's hidden_size is 16,384 (its config.json); "
                           "131,072 is 8x")
MODEL_FFN = Bound("intermediate size", 1, 2**19, integer=True,
                  reason="Llama-3.1-405B's intermediate_size is 53,248 (its config.json); "
                         "524,288 is ~10x")
MODEL_HEADS = Bound("attention heads", 1, 1024, integer=True,
                    reason="Llama-3.1-405B and DeepSeek-V3 have 128 query heads (their "
                           "config.json); 1024 is 8x")
MODEL_HEAD_DIM = Bound("head dim", 1, 4096, integer=True,
                       reason="the widest heads in the catalog are 256 (Gemma 2/3, Qwen3-Next "
                              "config.json); 4096 is 16x")
MODEL_VOCAB = Bound("vocabulary (tokens)", 1, 2**21, integer=True,
                    reason="Gemma 3's 262,208 tokens is the largest published vocabulary in "
                           "the catalog (Gemma3TextConfig); 2,097,152 is 8x")
MODEL_EXPERTS = Bound("experts", 1, 8192, integer=True,
                      reason="Qwen3-Next and Qwen3.5 route over 512 experts (their "
                             "config.json); 8192 is 16x")
MODEL_CONTEXT = Bound("context (tokens)", 1, TOKENS.hi, integer=True,
                      reason="the longest published context is Llama 4 Scout's 10,485,760 "
                             "tokens (its config.json); 16.7M is the longest prompt capplan "
                             "accepts (token lengths)")

SIM_HORIZON_S = 4.0e9
"""Largest simulated span (requests / rate): float64 time stamps resolve 1 us up to 2**52 us
(4.5e9 s); past that a 1 ms step no longer changes the clock and TTFT reads 0."""
MAX_LIST_ITEMS = 10_000
"""Longest list an option may expand to ('1:100000000' would build a 100M-element list)."""
MAX_YAML_DEPTH = 64
"""Deepest nesting of a YAML document (plan files need ~5; deep nesting recursed out)."""


def check_int_list(values: Any, bound: Bound, name: str = "") -> list[int]:
    """A list option's values (CLI `1,8,32` expanded, or a Python list): at most
    MAX_LIST_ITEMS, each a whole number inside `bound` (the CLI and the API share it)."""
    label = f"{name}: " if name else ""
    if isinstance(values, str | bytes) or not hasattr(values, "__len__"):
        raise InputError(f"{label}{str(values)[:40]!r} is not a list of integers")
    if len(values) > MAX_LIST_ITEMS:
        raise InputError(f"{label}{len(values):,} values exceed the {MAX_LIST_ITEMS:,} a list "
                         "may hold")
    if not len(values):
        raise InputError(f"{label}an empty list: give at least one value")
    return [int(bound.check(v, name)) for v in values]


# --- caps (raisable with `capplan --limit NAME=VALUE`) --------------------------------------
@dataclass(frozen=True)
class Cap:
    name: str
    default: float
    unit: str
    why: str


CAPS: dict[str, Cap] = {c.name: c for c in (
    Cap("sim_requests", 500_000, "requests",
        "a simulated request costs ~1.5 KB and ~0.1 ms (300,000 took 41 s and 0.5 GB on one "
        "core): 500,000 is about a minute"),
    Cap("sim_tokens", 100_000_000, "output tokens",
        "simulated work grows with the tokens decoded, not the requests: 2,000 requests of "
        "20,000 tokens (40M) took 2 s and 0.2 GB compiled; the interpreted loop (no numba) "
        "is 10-20x slower, so 100M is about a minute there"),
    Cap("prefix_blocks", 5_000_000, "prompt blocks",
        "prefix caching keys every full prompt block it may share (~100 bytes a key: a "
        "Mooncake trace of 5,000 130k-token prompts, 40M blocks, took 4 GiB)"),
    Cap("yaml_bytes", 4 * MIB_BYTES, "bytes",
        "PyYAML holds ~130 bytes of objects per byte of text while it parses (a 5.8 MB file "
        "of lists: 0.76 GB and 42 s); plan and calibration files are a few kB"),
    Cap("speed_rows", 10_000, "rows", "batch x context rows of `capplan speed`"),
    Cap("plan_lanes", 64, "lanes", "each lane is planned (and simulated) on its own"),
    Cap("plan_configurations", 20_000, "configurations",
        "the default search is ~3,000 configurations in ~0.5 s; 100,000 took 17 s of CPU"),
    Cap("file_bytes", 128 * MIB_BYTES, "bytes",
        "a trace is parsed row by row at ~10 us a row (a 19 MB, 1M-row trace: 11 s, 146 MB); "
        "results, calibration and plan files are parsed whole"),
)}

_overrides: dict[str, float] = {}


def cap(name: str) -> float:
    """The cap's current value (its default unless `--limit` raised it)."""
    return _overrides.get(name, CAPS[name].default)


def set_cap(assignment: str) -> None:
    """'NAME=VALUE' from `capplan --limit`; VALUE may use 'k', 'M', 'G' suffixes."""
    name, sep, text = assignment.partition("=")
    name = name.strip()
    if not sep or name not in CAPS:
        raise InputError(f"--limit {assignment!r}: expected NAME=VALUE with NAME one of "
                         f"{', '.join(CAPS)}")
    # decimal prefixes: the factors of kB, MB, GB
    mult = {"k": KB_BYTES, "m": MB_BYTES, "g": GB_BYTES}.get(text.strip()[-1:].lower(), 1.0)
    body = text.strip()[:-1] if mult != 1.0 else text.strip()
    try:
        x = float(body) * mult
    except ValueError:
        raise InputError(f"--limit {assignment!r}: {text!r} is not a number") from None
    if not math.isfinite(x) or x < 1:
        raise InputError(f"--limit {assignment!r}: the value must be a finite number >= 1")
    _overrides[name] = x


def reset_caps() -> None:
    _overrides.clear()


def check_cap(name: str, estimate: float, what: str) -> None:
    """InputError when the work estimate exceeds the cap, naming the limit and the flag."""
    limit = cap(name)
    if estimate > limit:
        c = CAPS[name]
        raise InputError(f"{what}: {estimate:,.0f} {c.unit} exceeds the {name} limit of "
                         f"{limit:,.0f} ({c.why}); raise it with `capplan --limit "
                         f"{name}={int(estimate)}` if you mean it")


def check_sim_horizon(num_requests: int, rate_per_s: float) -> None:
    """A simulated span float64 time stamps resolve to 1 us (SIM_HORIZON_S)."""
    span = num_requests / rate_per_s
    if span > SIM_HORIZON_S:
        raise InputError(f"{num_requests} requests at {rate_per_s:g} req/s span {span:.3g} s of "
                         f"simulated time, past {SIM_HORIZON_S:.1g} s where float64 time "
                         "stamps stop resolving a step: raise the rate or simulate fewer requests")


def check_context(tokens: float, max_model_len: int, what: str) -> None:
    if tokens > max_model_len:
        raise InputError(f"{what} {tokens:g} tokens exceeds the model's context of "
                         f"{max_model_len} tokens (max_model_len)")


# --- files ----------------------------------------------------------------------------------
def check_input_file(path: str | Path, what: str = "file") -> int:
    """Size in bytes of a regular file under the file_bytes cap; refuses devices, FIFOs,
    folders (`plan /dev/zero` read until memory ran out)."""
    p = Path(path)
    try:
        st = os.stat(p)
    except OSError as e:
        raise InputError(f"{p}: cannot read ({e.strerror or e})") from None
    if not stat.S_ISREG(st.st_mode):
        kind = "a folder" if stat.S_ISDIR(st.st_mode) else "not a regular file"
        raise InputError(f"{p}: {kind}; give a {what} on disk")
    check_cap("file_bytes", st.st_size, f"{p}")
    return st.st_size


def read_text(path: str | Path, what: str = "file", encoding: str = "utf-8") -> str:
    """The text of a regular file under the file_bytes cap."""
    check_input_file(path, what)
    with named_decode_errors(path), open(path, encoding=encoding) as f:
        return f.read(int(cap("file_bytes")) + 1)


@contextmanager
def named_decode_errors(path: str | Path) -> Iterator[None]:
    """Reading a text file inside: a UnicodeDecodeError becomes an InputError naming the file
    and the offset of its first byte that is not UTF-8 (the decoder's own offset counts from
    the chunk it was decoding)."""
    try:
        yield
    except UnicodeDecodeError as e:
        where = f"{e.reason}"
        try:
            with open(path, "rb") as f:
                f.read().decode("utf-8")  # under the file_bytes cap: checked before reading
        except UnicodeDecodeError as whole:
            where = f"{whole.reason} at byte {whole.start}"
        except OSError:
            pass
        raise InputError(f"{path}: not UTF-8 text ({where}); save it as UTF-8") from None
