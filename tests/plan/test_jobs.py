"""`--jobs N` (issue 17): verification simulations in parallel give the serial answer."""

from __future__ import annotations

import pytest

from capplan.plan.verify import PARALLEL_MIN_REQUESTS, ParallelVerifier

REC = ("recommend", "--model", "llama-3.1-8b", "--rate", "30", "--gpu", "h100-sxm",
       "--gpu", "a100-sxm-80gb", "--tp", "1", "--ttft-p99", "1", "--tbt-p99", "0.06",
       "--verify-top", "3", "--format", "json")


def test_parallel_recommend_equals_serial(run_cli, monkeypatch):
    calls = []
    real_map, real_while = ParallelVerifier.map, ParallelVerifier.map_while

    def spy(self, jobs):  # noqa: ANN001, ANN202
        calls.append(sum(j.requests for j in jobs))
        return real_map(self, jobs)

    def spy_while(self, jobs, meanwhile):  # noqa: ANN001, ANN202 (the disaggregated plan)
        calls.append(sum(j.requests for j in jobs))
        return real_while(self, jobs, meanwhile)

    monkeypatch.setattr(ParallelVerifier, "map", spy)
    monkeypatch.setattr(ParallelVerifier, "map_while", spy_while)
    serial = run_cli(*REC, "--jobs", "1")
    parallel = run_cli(*REC, "--jobs", "2")
    assert serial.exit_code == parallel.exit_code == 0, parallel.stderr
    # the parallel run really used worker processes (enough requests to verify)
    assert calls and calls[0] >= PARALLEL_MIN_REQUESTS
    a, b = serial.json(), parallel.json()
    assert [r.get("verified") for r in a["recommendations"]] == \
        [r.get("verified") for r in b["recommendations"]]
    assert a == b


@pytest.mark.parametrize("bad", ["0", "x"])
def test_jobs_rejects_bad_values(run_cli, bad):
    res = run_cli(*REC, "--jobs", bad)
    assert res.exit_code == 2 and len(res.stderr_lines) == 1


def _small_job():
    """A real verification job (llama-3.1-8b on h100-sxm, vLLM defaults) of 64 requests."""
    from capplan.catalog.loader import load_catalog
    from capplan.plan.deployment import EngineOptions, resolve_deployment
    from capplan.plan.schema import Lane
    from capplan.plan.verify import VerifyJob

    dep = resolve_deployment(load_catalog(), "llama-3.1-8b", "h100-sxm",
                             EngineOptions(max_model_len=2048))
    s = dep.settings
    lane = Lane(name="chat", rate_per_s=5.0, input_len=256, output_len=64)
    return VerifyJob(lanes=(lane,), replicas=1, step=dep.step,
                     num_gpu_blocks=dep.pool.num_blocks, block_size=dep.pool.block_size,
                     max_num_seqs=s.max_num_seqs, max_num_batched_tokens=s.max_num_batched_tokens,
                     max_model_len=s.max_model_len, requests=64, policy=s.profile.scheduler)


def test_engine_choice_does_not_depend_on_jobs():
    """One simulator for a plan's verification: compiled (numba is in the test extra) from
    PARALLEL_MIN_REQUESTS simulated requests in all, `auto` below; so a serial and a parallel
    run simulate the same way."""
    from dataclasses import replace

    from capplan.plan.verify import numba_installed, verification_engine

    job = _small_job()
    few = [replace(job, requests=PARALLEL_MIN_REQUESTS // 4)] * 3
    many = [replace(job, requests=PARALLEL_MIN_REQUESTS // 4)] * 4
    assert verification_engine(few) == "auto"
    assert verification_engine(many) == ("compiled" if numba_installed() else "auto")


def test_warm_workers_give_the_serial_results_and_stop():
    """The warmed workers (compiled engine loaded by `prepare`) return what a serial call
    returns, and `close` leaves no worker process behind."""
    import os
    from dataclasses import replace

    from capplan.plan.verify import numba_installed, simulate_recommendation

    engine = "compiled" if numba_installed() else "auto"
    jobs = [replace(_small_job(), requests=n, sim_engine=engine) for n in (1000, 1100)]
    with ParallelVerifier(2) as v:
        v.prepare(_small_job())
        procs = list((getattr(v._pool, "_processes", None) or {}).values())
        pids = [p.pid for p in procs]
        got = v.map(jobs)
    # close() has reaped every worker before it returned, whatever the machine's load
    # (before: it left the reaping to the pool's thread and the check below raced it)
    assert all(p.exitcode is not None for p in procs)
    assert got == [simulate_recommendation(j) for j in jobs]
    assert pids or not numba_installed(), "prepare started no worker"
    for pid in pids:  # terminated and reaped: no such process
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_default_jobs_leave_a_core_to_the_search(monkeypatch):
    """The CLI's default `--jobs` (the cores available) warms one worker fewer than the cores,
    at least one: on 2 cores the parent's analytic search keeps a core while one worker loads
    the compiled engine; that single warm worker then runs the verification (its results are
    the serial ones). An explicit `--jobs 2` keeps two workers."""
    import os
    from dataclasses import replace

    from capplan.plan.verify import numba_installed, simulate_recommendation

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    engine = "compiled" if numba_installed() else "auto"
    jobs = [replace(_small_job(), requests=n, sim_engine=engine) for n in (1000, 1100)]
    with ParallelVerifier(2, spare_core=True) as v:
        assert v.jobs == 1
        assert (v._pool is not None) == numba_installed()
        pids = list(getattr(v._pool, "_processes", None) or {})
        got = v.map(jobs)
        pids = list(getattr(v._pool, "_processes", None) or {}) or pids
    assert len(pids) == (1 if numba_installed() else 0)
    assert got == [simulate_recommendation(j) for j in jobs]
    from capplan.plan import verify

    monkeypatch.setattr(verify, "numba_installed", lambda: False)  # no worker needed here
    with ParallelVerifier(2) as v:
        assert v.jobs == 2
