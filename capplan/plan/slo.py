"""Latency objectives (p99 TTFT, TBT, E2E; TPOT p99 and mean) and the one check of a result
against them.

The same `SloSet` checks the analytic model's arrays during the search, one prediction's
margins, and the simulator's result: each takes the contract shape `res[metric][stat]`
(a float or an array), so the three can never disagree on what "meets the SLOs" means.

TBT is every inter-token gap (vllm bench serve's ITL); TPOT is one request's mean gap,
(E2E - TTFT) / (output tokens - 1), as vllm bench serve and AIConfigurator report it. Their
means are the same gaps averaged per token or per request, but a request's mean gap averages
its stalls over its output: the analytic model answers TPOT with the decode time's law over a
request's gaps (capplan.models.queueing `tpot_s`) and the simulator measures it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class SloTarget:
    """One objective: the `stat` (p99 or mean) of `metric` (a contract latency key) at most
    `limit_s`."""

    metric: str
    """'ttft_s', 'tbt_s', 'tpot_s' or 'e2e_s'."""
    label: str
    """'TTFT', 'TBT', 'TPOT' or 'E2E'."""
    limit_s: float
    stat: str = "p99"
    """'p99' or 'mean'."""

    @property
    def margin_key(self) -> str:
        """The key of this objective in `slo_margins` ('ttft_p99', 'tpot_mean', ...)."""
        return f"{self.label.lower()}_{self.stat}"


_TARGETS = (("ttft_s", "TTFT", "p99"), ("tbt_s", "TBT", "p99"), ("tpot_s", "TPOT", "p99"),
            ("tpot_s", "TPOT", "mean"), ("e2e_s", "E2E", "p99"))
_FIELDS = tuple(f"{label.lower()}_{stat}_s" for _, label, stat in _TARGETS)


def _value(res: Mapping[str, Any], t: SloTarget) -> Any:
    return res[t.metric][t.stat]


def _over(got_ms: float, limit_ms: float) -> tuple[str, str]:
    """`got_ms` and `limit_ms` (got > limit) with as many decimals as show the miss (80.04 >
    80.0, not 80.0 > 80.0): one at least, up to six."""
    digits = 1
    while digits < 6 and round(got_ms, digits) <= round(limit_ms, digits):
        digits += 1
    return f"{got_ms:.{digits}f}", f"{limit_ms:.1f}"


@dataclass(frozen=True)
class SloSet:
    """The latency objectives of a lane, or the strictest of several lanes."""

    ttft_p99_s: float | None = None
    tbt_p99_s: float | None = None
    e2e_p99_s: float | None = None
    tpot_p99_s: float | None = None
    tpot_mean_s: float | None = None

    @classmethod
    def of(cls, slo: Any) -> SloSet:
        """From anything with the objectives as attributes (a plan's Slo); missing ones are
        None."""
        return cls(**{f: getattr(slo, f, None) for f in _FIELDS})

    @classmethod
    def strictest(cls, slos: Iterable[SloSet]) -> SloSet:
        """One set whose every objective is the smallest given for it (pooled lanes)."""
        slos = list(slos)

        def least(attr: str) -> float | None:
            vals = [getattr(s, attr) for s in slos if getattr(s, attr)]
            return min(vals) if vals else None

        return cls(**{f: least(f) for f in _FIELDS})

    def __iter__(self) -> Iterator[SloTarget]:
        for (metric, label, stat), f in zip(_TARGETS, _FIELDS, strict=True):
            limit = getattr(self, f)
            if limit is not None:
                yield SloTarget(metric, label, limit, stat)

    def only(self, *metrics: str) -> SloSet:
        """The objectives on the given metrics alone (the others dropped)."""
        return SloSet(**{f: getattr(self, f) for (metric, _, _), f in zip(_TARGETS, _FIELDS,
                                                                         strict=True)
                         if metric in metrics})

    def ok(self, res: Mapping[str, Any]) -> Any:
        """True where every objective holds (elementwise on arrays)."""
        ok: Any = True
        for t in self:
            ok = np.logical_and(ok, np.asarray(_value(res, t)) <= t.limit_s)
        return ok

    def violated(self, res: Mapping[str, Any]) -> list[tuple[SloTarget, Any]]:
        """(objective, mask where it is exceeded) for each objective, in TTFT, TBT, TPOT, E2E
        order."""
        return [(t, np.asarray(_value(res, t)) > t.limit_s) for t in self]

    def margins(self, res: Mapping[str, Any]) -> dict[str, float]:
        """1 - value / objective per objective: the fraction of each SLO left unused."""
        return {t.margin_key: float(1 - _value(res, t) / t.limit_s) for t in self}

    def misses(self, res: Mapping[str, Any], who: str = "") -> list[str]:
        """One phrase per objective the result misses: 'p99 TTFT 812.0 ms > 800.0 ms'."""
        out = []
        for t in self:
            got = (res.get(t.metric) or {}).get(t.stat)  # a lane the run never served: no key
            if got is not None and got > t.limit_s:
                shown, limit = _over(got * 1e3, t.limit_s * 1e3)
                out.append(f"{t.stat} {t.label}{who} {shown} ms > {limit} ms")
        return out

    def worst(self, res: Mapping[str, Any]) -> tuple[float, SloTarget | None, float]:
        """(value / objective, objective, value) of the objective the result is furthest over,
        among those it reports (a replay names every one; a lane it never served, none)."""
        worst: tuple[float, SloTarget | None, float] = (0.0, None, 0.0)
        for t in self:
            if (got := (res.get(t.metric) or {}).get(t.stat)) is None:
                continue
            got = float(got)
            if worst[1] is None or got / t.limit_s > worst[0]:
                worst = (got / t.limit_s, t, got)
        return worst
