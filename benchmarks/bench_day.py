"""Day-plan speed (issue 25): `recommend --trace` on a day of ~1M requests.

The day is built from a real excerpt, the first 200 requests of the Azure 2023 conversation
trace (tests/data/traces/vidur_splitwise_conv_head200.csv), repeated and time-warped to a
diurnal curve (a trough of 4 req/s at 04:00, a peak of 20 req/s at 15:00, linear between: an
assumed shape; ~1.0M requests). The trace is written to a temporary CSV and planned as a user
would: read, windows, the peak's steady-rate plan (one GPU type), the schedule, and the fleet
replay of the peak window and its neighbours. Prints the time of each part and the peak RSS.

    python benchmarks/bench_day.py [--peak 20] [--trough 4]
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from capplan import api  # noqa: E402
from capplan.plan.rate_curve import parse_rate_curve, warp_trace  # noqa: E402
from capplan.sim.workload import load_trace  # noqa: E402

AZURE_HEAD = ROOT / "tests" / "data" / "traces" / "vidur_splitwise_conv_head200.csv"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--peak", type=float, default=20.0)
    ap.add_argument("--trough", type=float, default=4.0)
    args = ap.parse_args()
    curve = parse_rate_curve([{"at": "04:00", "rate_per_s": args.trough},
                              {"at": "15:00", "rate_per_s": args.peak}])
    day = warp_trace(load_trace(AZURE_HEAD), curve)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "azure_day.csv"
        rows = np.column_stack([day.arrival_at_s, day.input_tokens, day.output_tokens])
        np.savetxt(path, rows, fmt=["%.3f", "%d", "%d"], delimiter=",",
                   header="arrival_time_s,input_tokens,output_tokens", comments="")
        t0 = time.perf_counter()
        res = api.recommend("llama-3.1-70b", trace=str(path), gpus=["h100-sxm"],
                            ttft_p99_s=1.0, tbt_p99_s=0.05, verify=False)
        dt = time.perf_counter() - t0
    d = res.to_dict()
    rss_gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    peak = max(d["schedule"], key=lambda w: w["offered_rps"])
    rp = (peak.get("replay") or {}).get("planned", {})
    print(f"day plan: {len(day):,} requests, {len(d['schedule'])} windows, planned in "
          f"{dt:.1f} s (target < 30 s), peak RSS {rss_gib:.2f} GiB (target < 1 GiB)")
    print(f"  peak {d['peak_replicas']} replicas x {d['day']['gpus_per_replica']} GPUs; "
          f"{d['gpu_hours']:.0f} GPU-hours autoscaled vs {d['fixed_fleet_gpu_hours']:.0f} "
          f"fixed ({d['saving_frac']:.0%} saved)")
    print(f"  peak window replayed: TTFT p99 {rp.get('ttft_p99_s', float('nan')):.3f} s, "
          f"TBT p99 {rp.get('tbt_p99_s', float('nan')):.4f} s, attainment "
          f"{rp.get('attainment')}, meets the SLOs within 10%: {rp.get('meets_slo')}")
    for w in d["schedule"]:
        if w.get("replay"):
            p, r = w["replay"]["planned"], w["replay"]["reactive"]
            print(f"  window {w['start_s'] / 3600:5.2f} h: {w['offered_rps']:.2f} req/s, "
                  f"planned {p['replicas']} replicas attainment {p['attainment']:.3f}, "
                  f"reactive {r['replicas']} attainment {r['attainment']:.3f}")


if __name__ == "__main__":
    main()
