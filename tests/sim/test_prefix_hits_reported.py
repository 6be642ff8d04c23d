"""Prefix-cache hits are a figure whenever the replay runs the prefix cache, 0 included.

Before: `prefix_hit_tokens` / `prefix_hit_frac` and the table row appeared only when there were
hits, so a cache that thrashed (sessions whose next turn comes after the history was evicted)
looked like a run without prefix caching, and scripts reading the key got a KeyError."""

from __future__ import annotations

SIM = ("simulate", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--rate", "20",
       "--requests", "2000", "--input-len", "1024", "--output-len", "128")


def test_a_thrashing_cache_reports_zero_hits(run_cli) -> None:  # noqa: ANN001
    # 4-turn sessions 5,000 s apart: 2,000 requests at 20 req/s arrive over ~100 s, so no
    # history is ever resent within the run: no prompt token can be a hit
    thrash = (*SIM, "--turns", "4", "--think-time", "5000")
    r = run_cli(*thrash, "--format", "json")
    assert r.exit_code == 0, r.stderr
    assert (r.json()["prefix_hit_tokens"], r.json()["prefix_hit_frac"]) == (0, 0.0)
    table = run_cli(*thrash)
    assert "prefix cache hits (% of prompt tokens)" in table.stdout


def test_without_shared_content_there_is_no_cache_figure(run_cli) -> None:  # noqa: ANN001
    """Requests that share nothing do not run the cache: no key (documented as absent)."""
    r = run_cli(*SIM[:7], "--requests", "50", "--format", "json")
    assert r.exit_code == 0, r.stderr
    assert "prefix_hit_tokens" not in r.json() and "prefix_hit_frac" not in r.json()
