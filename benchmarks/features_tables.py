"""The example tables of docs/features.md, computed with capplan's API.

Each table states its settings in its generated block (model, GPU, load, lengths), so that the
figures and what they were computed for cannot drift apart:

- `vision`: mean TTFT by images per request (`capplan latency --images-per-request N`);
- `eagle3_open_loop`: EAGLE-3 under an open-loop rate, the analytic queue against the
  2,000-request replay it is screened with (`latency`'s `analytic_check`);
- `eagle3_concurrency`: plain against EAGLE-3 output throughput under closed loops
  (`capplan latency --concurrency C`), with each step's bound from `capplan speed`.

    python benchmarks/features_tables.py [--write-docs]
"""

from __future__ import annotations

import argparse

from docblocks import ROOT, write_block  # benchmarks/ is on sys.path when run as a script

import capplan

DOC = ROOT / "docs" / "features.md"
LLAMA, H100 = "llama-3.1-8b", "h100-sxm"

VISION = {"model": "qwen2.5-vl-7b", "gpu": H100, "rate": 1.0, "input_len": 200,
          "output_len": 256, "image_px": 1024, "images": (0, 1, 2, 4)}
OPEN_LOOP = {"rates": (2.0, 10.0), "input_len": 500, "output_len": 300}
CONCURRENCY = {"streams": (1, 64, 128, 256), "input_len": 300, "output_len": 300}
EAGLE3 = {"speculative": "eagle3"}  # K = 3, the default draft length; published acceptance
PAPER_BATCH_64 = 1.38
"""The EAGLE-3 paper's (Li et al. 2025) throughput speed-up in SGLang at batch 64, as
docs/features.md has cited it."""


def vision_table() -> str:
    v = VISION
    out = [f"Settings: {v['model']}, one {v['gpu']}, open loop at {v['rate']:g} request/s, "
           f"{v['input_len']} text tokens and {v['output_len']} output tokens per request, "
           f"images of {v['image_px']} x {v['image_px']} px (`capplan latency --model "
           f"{v['model']} --gpu {v['gpu']} --rate "
           f"{v['rate']:g} --input-len {v['input_len']} --output-len {v['output_len']} "
           "--images-per-request N`).", "",
           "| images per request | prompt tokens | mean TTFT (ms) | answered by |",
           "|---|---|---|---|"]
    for n in v["images"]:
        r = capplan.latency(v["model"], v["gpu"], rate=v["rate"], input_len=v["input_len"],
                            output_len=v["output_len"], images_per_request=n,
                            image_width=v["image_px"], image_height=v["image_px"]).to_dict()
        prompt = r["input_tokens_per_s"] / r["requests_per_s"]
        out.append(f"| {n} | {prompt:,.0f} | {r['ttft_s']['mean'] * 1e3:.1f} | "
                   f"{r['answered_by']} |")
    return "\n".join(out) + "\n"


def open_loop_table() -> str:
    o = OPEN_LOOP
    out = [f"Settings: {LLAMA}, one {H100}, EAGLE-3 at the default K = 3 and acceptance "
           f"length, {o['input_len']}-token prompts and {o['output_len']}-token outputs, "
           f"open loop (`capplan latency --model {LLAMA} --gpu {H100} --rate R --input-len "
           f"{o['input_len']} --output-len {o['output_len']} --speculative eagle3`); "
           "simulated = the "
           "2,000-request replay `latency` screens the analytic queue with.", "",
           "| rate (req/s) | TTFT analytic / simulated | TBT analytic / simulated |",
           "|---|---|---|"]
    for rate in o["rates"]:
        r = capplan.latency(LLAMA, H100, rate=rate, input_len=o["input_len"],
                            output_len=o["output_len"], **EAGLE3).to_dict()
        a, s = r["analytic_check"]["analytic"], r["analytic_check"]["replay"]
        out.append(f"| {rate:g} | {a['ttft_s']['mean'] * 1e3:.1f} / "
                   f"{s['ttft_s']['mean'] * 1e3:.1f} ms | {a['tbt_s']['mean'] * 1e3:.2f} / "
                   f"{s['tbt_s']['mean'] * 1e3:.2f} ms |")
    return "\n".join(out) + "\n"


def _closed_loop_tok_s(streams: int, **kw: str) -> float:
    c = CONCURRENCY
    r = capplan.latency(LLAMA, H100, concurrency=streams, input_len=c["input_len"],
                        output_len=c["output_len"], **kw)
    return float(r.to_dict()["output_tokens_per_s"])


def _bound(streams: int, context: float, **kw: str) -> str:
    return str(capplan.speed(LLAMA, H100, batch=[streams], context=[int(context)],
                             **kw).rows[0]["bound"])


def concurrency_table() -> str:
    c = CONCURRENCY
    context = c["input_len"] + c["output_len"] / 2  # a decode's mean context over its output
    out = [f"Settings: {LLAMA}, one {H100}, {c['input_len']}-token prompts and "
           f"{c['output_len']}-token outputs, closed loops of C streams measured as `vllm bench "
           f"serve` does (`capplan latency --model {LLAMA} --gpu {H100} --concurrency C "
           f"--input-len {c['input_len']} "
           f"--output-len {c['output_len']} [--speculative eagle3]`); the step bound is "
           f"`capplan speed`'s at batch C and context {context:.0f} (prompt + half the "
           "output).", "",
           "| concurrent streams | plain tok/s | EAGLE-3 tok/s | speed-up | step bound plain / "
           "EAGLE-3 |", "|---|---|---|---|---|"]
    ratio = {}
    for n in c["streams"]:
        plain, spec = _closed_loop_tok_s(n), _closed_loop_tok_s(n, **EAGLE3)
        ratio[n] = spec / plain
        out.append(f"| {n} | {plain:,.0f} | {spec:,.0f} | {ratio[n]:.2f}x | "
                   f"{_bound(n, context)} / {_bound(n, context, **EAGLE3)} |")
    if 64 in ratio:
        out += ["", f"The EAGLE-3 paper reports {PAPER_BATCH_64}x in SGLang at batch 64; the "
                f"model's {ratio[64]:.2f}x is {ratio[64] / PAPER_BATCH_64 - 1:+.0%}."]
    return "\n".join(out) + "\n"


TABLES = {"features_tables:vision": vision_table,
          "features_tables:eagle3_open_loop": open_loop_table,
          "features_tables:eagle3_concurrency": concurrency_table}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write-docs", action="store_true", help="rewrite the tables in "
                    "docs/features.md")
    args = ap.parse_args()
    for key, make in TABLES.items():
        text = make()
        print(text)
        if args.write_docs:
            write_block(DOC, key, text)


if __name__ == "__main__":
    main()
