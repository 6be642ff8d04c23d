"""Reference routing for the fleet tests: the routers that read no replica state
(round-robin, prefix-affinity) applied first, in plain Python, so each replica's requests can
run on a single engine and be compared with the fleet loop (tests/sim/test_fleet.py,
test_fleet_prefix.py)."""

from __future__ import annotations

import numpy as np

from capplan.sim import Requests


def route_static(arrival_s: np.ndarray, keys: np.ndarray, ready: np.ndarray, stop: np.ndarray,
                 router: str) -> tuple[np.ndarray, np.ndarray]:
    """(replica, dispatch time) per request for the routers that do not read replica state
    (round-robin, prefix-affinity); replica -1 when none ever accepts it. The accepting set
    changes only at the replicas' ready and stop times: it is recomputed there."""
    n = len(arrival_s)
    rep = np.full(n, -1, np.int64)
    disp = np.asarray(arrival_s, float).copy()
    owner: dict[int, int] = {}
    rr = 0
    serving = ready < stop
    edges = np.unique(np.concatenate([ready[serving], stop[serving & np.isfinite(stop)]]))
    acc: list[int] = []
    seg = (np.inf, -np.inf)  # the interval [lo, hi) where `acc` holds
    for i in range(n):
        t = disp[i]
        if not seg[0] <= t < seg[1]:
            acc, seg = _accepting(t, ready, stop, edges)
        if not acc:  # wait at the router for the next replica to become ready
            later = ready[serving & (ready > t)]
            if not len(later):
                continue
            t = disp[i] = later.min()
            acc, seg = _accepting(t, ready, stop, edges)
        k = int(keys[i])
        r = owner.get(k, -1) if router == "prefix-affinity" and k >= 0 else -1
        if r < 0 or not (ready[r] <= t < stop[r]):
            r = acc[rr % len(acc)]
            rr += 1
            if k >= 0:
                owner[k] = r
        rep[i] = r
    return rep, disp


def _accepting(t: float, ready: np.ndarray, stop: np.ndarray, edges: np.ndarray
               ) -> tuple[list[int], tuple[float, float]]:
    """The replicas accepting at t, in index order, and the interval of times where that set
    holds (between two ready/stop edges)."""
    j = int(np.searchsorted(edges, t, side="right"))
    lo = edges[j - 1] if j > 0 else -np.inf
    hi = edges[j] if j < len(edges) else np.inf
    return np.flatnonzero((ready <= t) & (stop > t)).tolist(), (lo, hi)


def _subset(reqs: Requests, idx: np.ndarray, dispatch_s: np.ndarray) -> Requests:
    def pick(a: np.ndarray | None) -> np.ndarray | None:
        return None if a is None else np.asarray(a)[idx]

    hashes = None if reqs.hash_ids is None else tuple(reqs.hash_ids[i] for i in idx)
    return Requests(dispatch_s[idx], np.asarray(reqs.input_tokens)[idx],
                    np.asarray(reqs.output_tokens)[idx], np.asarray(reqs.lane)[idx], None,
                    reqs.note, pick(reqs.prefix_group), pick(reqs.prefix_tokens), hashes,
                    reqs.hash_block_tokens)
