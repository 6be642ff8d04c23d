"""Latency objectives (p99 TTFT, TBT, E2E) and the one check of a result against them.

The same `SloSet` checks the analytic model's arrays during the search, one prediction's
margins, and the simulator's result: each takes the contract shape `res[metric]["p99"]`
(a float or an array), so the three can never disagree on what "meets the SLOs" means.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class SloTarget:
    """One objective: the p99 of `metric` (a contract latency key) at most `limit_s`."""

    metric: str
    """'ttft_s', 'tbt_s' or 'e2e_s'."""
    label: str
    """'TTFT', 'TBT' or 'E2E'."""
    limit_s: float

    @property
    def margin_key(self) -> str:
        """The key of this objective in `slo_margins` ('ttft_p99', ...)."""
        return f"{self.label.lower()}_p99"


_LABELS = (("ttft_s", "TTFT"), ("tbt_s", "TBT"), ("e2e_s", "E2E"))


def _p99(res: Mapping[str, Any], metric: str) -> Any:
    return res[metric]["p99"]


@dataclass(frozen=True)
class SloSet:
    """The p99 latency objectives of a lane, or the strictest of several lanes."""

    ttft_p99_s: float | None = None
    tbt_p99_s: float | None = None
    e2e_p99_s: float | None = None

    @classmethod
    def of(cls, slo: Any) -> SloSet:
        """From anything with ttft_p99_s, tbt_p99_s and e2e_p99_s attributes (a plan's Slo)."""
        return cls(slo.ttft_p99_s, slo.tbt_p99_s, slo.e2e_p99_s)

    @classmethod
    def strictest(cls, slos: Iterable[SloSet]) -> SloSet:
        """One set whose every objective is the smallest given for it (pooled lanes)."""
        slos = list(slos)

        def least(attr: str) -> float | None:
            vals = [getattr(s, attr) for s in slos if getattr(s, attr)]
            return min(vals) if vals else None

        return cls(least("ttft_p99_s"), least("tbt_p99_s"), least("e2e_p99_s"))

    def __iter__(self) -> Iterator[SloTarget]:
        for metric, label in _LABELS:
            limit = getattr(self, f"{label.lower()}_p99_s")
            if limit is not None:
                yield SloTarget(metric, label, limit)

    def only(self, *metrics: str) -> SloSet:
        """The objectives on the given metrics alone (the others dropped)."""
        keep = {f"{label.lower()}_p99_s": getattr(self, f"{label.lower()}_p99_s")
                for metric, label in _LABELS if metric in metrics}
        return SloSet(**keep)

    def ok(self, res: Mapping[str, Any]) -> Any:
        """True where every p99 is within its objective (elementwise on arrays)."""
        ok: Any = True
        for t in self:
            ok = np.logical_and(ok, np.asarray(_p99(res, t.metric)) <= t.limit_s)
        return ok

    def violated(self, res: Mapping[str, Any]) -> list[tuple[SloTarget, Any]]:
        """(objective, mask where it is exceeded) for each objective, in TTFT, TBT, E2E order."""
        return [(t, np.asarray(_p99(res, t.metric)) > t.limit_s) for t in self]

    def margins(self, res: Mapping[str, Any]) -> dict[str, float]:
        """1 - p99 / objective per objective: the fraction of each SLO left unused."""
        return {t.margin_key: float(1 - _p99(res, t.metric) / t.limit_s) for t in self}

    def misses(self, res: Mapping[str, Any], who: str = "") -> list[str]:
        """One phrase per objective the result misses: 'p99 TTFT 812.0 ms > 800.0 ms'."""
        out = []
        for t in self:
            got = (res.get(t.metric) or {}).get("p99")  # a lane the run never served: no key
            if got is not None and got > t.limit_s:
                out.append(f"p99 {t.label}{who} {got * 1e3:.1f} ms > {t.limit_s * 1e3:.1f} ms")
        return out

    def worst(self, res: Mapping[str, Any]) -> tuple[float, SloTarget | None, float]:
        """(p99 / objective, objective, p99) of the objective the result is furthest over."""
        worst: tuple[float, SloTarget | None, float] = (0.0, None, 0.0)
        for t in self:
            got = float(_p99(res, t.metric))
            if worst[1] is None or got / t.limit_s > worst[0]:
                worst = (got / t.limit_s, t, got)
        return worst
