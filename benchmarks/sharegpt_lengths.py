"""Token lengths of ShareGPT requests as SGLang's bench_serving samples them (Llama 3.1).

Writes benchmarks/data/sharegpt_llama31_lengths.csv (`input_tokens,output_tokens`), which
benchmarks/validate_saturation.py replays. Not run by the tests: it needs the dataset and a
Llama-3 tokenizer file, neither shipped here.

Run: python benchmarks/sharegpt_lengths.py DATASET.json TOKENIZER.json [OUT.csv]
(needs the `tokenizers` package).

The rules are bench_serving's `sample_sharegpt_requests` (sgl-project/sglang
python/sglang/bench_serving.py, 2024, the lineage of vLLM's benchmark_serving.py):
conversations with at least two turns; the first turn is the prompt, the second the reply whose
token count is the request's output length (`--sharegpt-output-len` unset, `ignore_eos` on);
lengths are `len(tokenizer(text).input_ids)`, which counts the Llama-3 tokenizer's
begin-of-text token; pairs with a prompt or reply under 4 tokens, a prompt over 1,024 or
prompt + reply over 2,048 tokens are dropped. Every remaining pair is written in file order
(the benchmark then draws its sample from them). A dataset file cut short (a truncated copy)
is read up to its last complete conversation.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parent / "data" / "sharegpt_llama31_lengths.csv"


def conversations(text: str) -> list[dict]:
    """The JSON array's objects, up to the last complete one."""
    dec, out = json.JSONDecoder(), []
    i = text.index("[") + 1
    while True:
        while i < len(text) and text[i] in " \n\r\t,":
            i += 1
        try:
            obj, i = dec.raw_decode(text, i)
        except json.JSONDecodeError:
            return out
        out.append(obj)


def lengths(dataset: Path, tokenizer_file: Path) -> list[tuple[int, int]]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_file))
    pairs = [(c["conversations"][0]["value"], c["conversations"][1]["value"])
             for c in conversations(dataset.read_text(encoding="utf-8"))
             if len(c.get("conversations", [])) >= 2]
    bos = 1  # tokenizer(text).input_ids of Llama-3.1 starts with <|begin_of_text|>
    ins = [len(e.ids) + bos for e in tok.encode_batch([p for p, _ in pairs],
                                                       add_special_tokens=False)]
    outs = [len(e.ids) + bos for e in tok.encode_batch([c for _, c in pairs],
                                                        add_special_tokens=False)]
    return [(i, o) for i, o in zip(ins, outs, strict=True)
            if i >= 4 and o >= 4 and i <= 1024 and i + o <= 2048]


def main() -> None:
    if len(sys.argv) < 3:
        sys.exit("usage: sharegpt_lengths.py DATASET.json TOKENIZER.json [OUT.csv]")
    out = Path(sys.argv[3]) if len(sys.argv) > 3 else OUT
    rows = lengths(Path(sys.argv[1]), Path(sys.argv[2]))
    out.write_text("input_tokens,output_tokens\n" + "".join(f"{i},{o}\n" for i, o in rows))
    n = len(rows)
    print(f"{out}: {n} requests, mean input {sum(r[0] for r in rows) / n:.1f}, "
          f"mean output {sum(r[1] for r in rows) / n:.1f} tokens")


if __name__ == "__main__":
    main()
