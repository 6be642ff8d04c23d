"""Speculative decoding on vLLM: derive the host costs and score the step model.

Data: vLLM issue 20780 (2025-07-10), Llama-3.1-8B-Instruct on one H100, batch 1, MT-Bench,
per draft length K: mean acceptance length (AL) and TPOT for EAGLE-1
(yuhuili/EAGLE-LLaMA3.1-Instruct-8B) and EAGLE-3 (yuhuili/EAGLE3-LLaMA3.1-Instruct-8B);
vanilla TPOT 7.07 ms. A speculative step lasts AL x TPOT.

1. Fit (EAGLE-1 rows): the per-step time the step model does not explain,
   (AL TPOT - 7.07 ms) - (model spec step - model plain step), against K by least squares:
   a + b K = host cost per speculative step + per draft pass (EngineProfile.spec_host_costs).
2. Score (EAGLE-3 rows, held out: another drafter): the predicted single-stream speed-up with
   the measured AL and with capplan's default AL, against 7.07 / TPOT.

    python benchmarks/speculative_vllm.py [--write-docs]
"""

from __future__ import annotations

import argparse

import numpy as np
from docblocks import ROOT, write_block  # benchmarks/ is on sys.path when run as a script

import capplan
from capplan.models.engine import engine_profile

EAGLE1 = {2: (2.10, 4.37), 3: (2.29, 4.29), 4: (2.39, 4.48), 5: (2.43, 4.71), 6: (2.45, 4.94),
          7: (2.47, 5.20)}
EAGLE3 = {2: (2.36, 4.32), 3: (2.79, 4.09), 4: (3.08, 4.05), 5: (3.32, 4.13), 6: (3.46, 4.20),
          7: (3.54, 4.29)}
VANILLA_TPOT_MS = 7.07
KW = dict(max_model_len=8192, batch=[1], context=[300])  # MT-Bench: short prompts
DOC = ROOT / "docs" / "features.md"


def _tok_s(**kw) -> float:
    return capplan.speed("llama-3.1-8b", "h100-sxm", **KW, **kw).rows[0]["tokens_per_s_total"]


def fit_host() -> tuple[float, float]:
    """(a, b) in seconds: host cost per speculative step and per draft pass (EAGLE-1 rows),
    measured against the step model without its host terms."""
    a0, b0 = engine_profile("vllm").spec_host_costs
    plain = 1 / _tok_s()
    ks, resid = [], []
    for k, (al, tpot) in EAGLE1.items():
        model = al / _tok_s(speculative="eagle", spec_tokens=k, acceptance_length=al)
        model -= a0 + b0 * k  # the step model's own GPU work only
        resid.append((al * tpot - VANILLA_TPOT_MS) * 1e-3 - (model - plain))
        ks.append(k)
    b, a = np.polyfit(ks, resid, 1)
    return float(a), float(b)


def score() -> list[dict[str, float]]:
    base = _tok_s()
    rows = []
    for k, (al, tpot) in EAGLE3.items():
        meas = VANILLA_TPOT_MS / tpot
        given = _tok_s(speculative="eagle3", spec_tokens=k, acceptance_length=al) / base
        default = _tok_s(speculative="eagle3", spec_tokens=k) / base
        tau = capplan.deployment("llama-3.1-8b", "h100-sxm", max_model_len=8192,
                                 speculative="eagle3", spec_tokens=k).step.spec_accept_len
        rows.append({"k": k, "al": al, "tau": tau, "measured": meas, "given": given,
                     "default": default})
    return rows


def table(rows: list[dict[str, float]]) -> str:
    out = ["| K | measured AL | default AL | measured speed-up | predicted (measured AL) | "
           "error | predicted (default AL) | error |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['k']} | {r['al']:.2f} | {r['tau']:.2f} | {r['measured']:.2f}x | "
                   f"{r['given']:.2f}x | {r['given'] / r['measured'] - 1:+.0%} | "
                   f"{r['default']:.2f}x | {r['default'] / r['measured'] - 1:+.0%} |")
    return "\n".join(out)


def eagle3_table() -> str:
    return table(score()) + "\n"


TABLES = {"speculative_vllm:eagle3": eagle3_table}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write-docs", action="store_true", help="rewrite the table in "
                    "docs/features.md")
    args = ap.parse_args()
    a, b = fit_host()
    print(f"host cost fit on EAGLE-1: {a * 1e3:.2f} ms per step + {b * 1e3:.3f} ms per pass "
          f"(in use: {engine_profile('vllm').spec_host_costs})")
    for key, make in TABLES.items():
        text = make()
        print(text, end="")
        if args.write_docs:
            write_block(DOC, key, text)


if __name__ == "__main__":
    main()
