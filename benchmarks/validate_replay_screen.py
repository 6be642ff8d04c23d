"""Where the analytic queue may answer `latency --rate` for the replay (capplan.plan.replay).

For a grid of open-loop loads (Poisson), `capplan.latency` computes the analytic queue and
replays 1,000 requests of the same load; the table gives the relative difference of each
checked figure (TTFT and TBT, mean and p99) and which model answered (analytic when all four
are within 15%). It is the screen's validation: the planner searches with the analytic model,
`latency` prints it only where this check passes.

Run: `.venv/bin/python benchmarks/validate_replay_screen.py [--write-docs]` (about a second per
row; `--write-docs` rewrites the block `validate_replay_screen:open-loop` in docs/queueing.md).
"""

from __future__ import annotations

import sys

import capplan

GRID = (
    # (model, gpu, engine options, rates req/s, input, output)
    ("llama-3.1-8b", "h100-sxm", {}, (2, 5, 10, 15, 20), "1024", "256"),
    ("llama-3.1-8b", "h100-sxm", {}, (2, 10), "lognormal:mean=800,p99=4000", "300"),
    ("llama-3.1-8b", "h100-sxm", {"engine": "sglang"}, (5, 10), "1024", "256"),
    ("llama-3.1-70b", "h200", {"tp": 4}, (1, 3, 6), "2048", "512"),
    ("llama-3.1-8b", "h100-sxm", {"engine": "trtllm"}, (5, 10), "1024", "256"),
    # whole 8,192-token prompts at the default max_num_tokens 8,192: one request at a time
    ("llama-3.1-70b", "b200", {"engine": "trtllm", "tp": 8}, (0.05, 0.1), "8192", "1024"),
)
DOC = "docs/queueing.md"


def rows() -> list[str]:
    out = ["| model / GPU | engine | rate (req/s) | lengths in / out | TTFT mean | TTFT p99 | "
           "TBT mean | TBT p99 | answered by |", "|---|---|---|---|---|---|---|---|---|"]
    for model, gpu, opts, rates, inp, outp in GRID:
        for r in rates:
            d = capplan.latency(model, gpu, rate=r, input_len=inp, output_len=outp,
                                **opts).data
            label = f"{model} / {gpu}" + (f" TP {opts['tp']}" if "tp" in opts else "")
            eng = opts.get("engine", "vllm")
            if not d.get("analytic_check"):  # above the analytic capacity: not replayed
                out.append(f"| {label} | {eng} | {r:g} | {inp} / {outp} | - | - | - | - | "
                           "unstable (analytic) |")
                continue
            diff = d["analytic_check"]["relative_difference"]
            cells = " | ".join(f"{diff[k]:+.0%}".replace("+", "") for k in
                               ("ttft_s.mean", "ttft_s.p99", "tbt_s.mean", "tbt_s.p99"))
            out.append(f"| {label} | {eng} | {r:g} | {inp} / {outp} | {cells} | "
                       f"{d['answered_by']} |")
    return out


def main() -> None:
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from docblocks import ROOT, report

    report(ROOT / DOC, "validate_replay_screen", {"open-loop": rows()}, "",
           "--write-docs" in sys.argv)


if __name__ == "__main__":
    main()
