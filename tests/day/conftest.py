"""A day of traffic built from a real excerpt: the first 200 requests of the Azure 2023
conversation trace (Vidur's splitwise_conv.csv, tests/data/traces/SOURCES.md), repeated and
time-warped so that its rate follows a diurnal curve (capplan.plan.rate_curve.warp_trace)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from capplan.plan.rate_curve import parse_rate_curve, warp_trace
from capplan.sim.workload import load_trace

DATA = Path(__file__).resolve().parents[1] / "data" / "traces"
AZURE_HEAD = DATA / "vidur_splitwise_conv_head200.csv"
# the diurnal shape is an assumption for the test (a trough at 04:00, a peak at 15:00,
# linear between), not a measurement
TROUGH, PEAK = 0.1, 1.0


def write_trace(reqs, path: Path) -> Path:
    rows = np.column_stack([reqs.arrival_at_s, reqs.input_tokens, reqs.output_tokens])
    np.savetxt(path, rows, fmt=["%.3f", "%d", "%d"], delimiter=",",
               header="arrival_time_s,input_tokens,output_tokens", comments="")
    return path


@pytest.fixture(scope="session")
def day_trace(tmp_path_factory) -> Path:
    curve = parse_rate_curve([{"at": "04:00", "rate_per_s": TROUGH},
                              {"at": "15:00", "rate_per_s": PEAK}])
    day = warp_trace(load_trace(AZURE_HEAD), curve)
    return write_trace(day, tmp_path_factory.mktemp("day") / "azure_day.csv")
