"""Latency under load for one engine replica doing continuous batching (vLLM V1 style).

Steady state at arrival rate lambda (open loop) -- derivation in docs/queueing.md:

- Little's law: sequences decoding B = lambda * E[O-1] * tau; prefill tokens per step
  P = lambda * E[I] * tau, where tau is the mean step time. tau depends on B and P through the
  step-time model, so tau is the fixed point tau = T(B(tau), P(tau)), found by bisection.
- A step holds new prefill work with probability f = 1 - exp(-lambda * tau * E[chunks]);
  decode-only steps take T(B, 0), prefill steps T(B, chunk). Every inter-token gap is one step,
  so the TBT distribution is that two-point mixture (prefill interference sets its tail). A
  prefill-first engine's gap is a decode step plus the prefill-only steps of every prompt
  admitted before the next one: the busy period of the prefill server (busy.py).
- TTFT = residual of the current step + wait behind other prefills (M/G/1 on prefill tokens,
  Pollaczek-Khinchine) + own prefill (its chunks) + wait for a slot when the concurrency cap
  (max_num_seqs or KV capacity) binds (M/G/c, Erlang C with the Allen-Cunneen correction).
  Waiting times get exponential tails (exact for M/M/c); TTFT and E2E percentiles are those of
  the sum of the terms' laws, convolved on a grid (see _sum_law).
- Unstable (the queue grows without bound) when prefill demand exceeds the token budget,
  the offered load reaches the concurrency cap, or the fixed point does not exist.

All functions broadcast: rates, and the StepModel's constants, may be arrays.

The rooms: laws.py (token-length laws, quantile levels), arrivals.py (arrival processes and the
waits and step loads they induce), steady.py (the mean steady state, its stability and capacity
bound), sums.py (quantile composition of sums of independent terms), busy.py (the busy period
that is a prefill-first engine's token gap), latency.py (the answer at a rate:
QueueModel.at_rate).
"""

from capplan.models.queueing.arrivals import chunk_sum_quantile
from capplan.models.queueing.latency import QueueModel, summarize
from capplan.models.queueing.laws import QUANTILES, Z99, LengthStats
from capplan.models.queueing.steady import Limits, SteadyState

__all__ = ["QUANTILES", "Z99", "LengthStats", "Limits", "QueueModel", "SteadyState",
           "chunk_sum_quantile", "summarize"]
