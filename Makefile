# capplan developer entry points. Each target creates .venv when it is missing.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test bench validate clean fuzz

$(BIN)/capplan: pyproject.toml
	test -d $(VENV) || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q -e '.[test]'
	$(BIN)/python -m compileall -q capplan  # as a wheel install does: no compile at each start
	touch $(BIN)/capplan

# torch (CPU build) for the probe tests: a local wheel on these machines, optional elsewhere.
$(VENV)/.torch: $(BIN)/capplan
	$(BIN)/pip install -q 'torch==2.13.0' || echo "torch not installed: probe tests will be skipped"
	touch $(VENV)/.torch

demo: $(BIN)/capplan
	$(BIN)/capplan plan examples/chat-8b.yaml

# Chromium + its driver from the distribution for the HTML report's browser test (Debian:
# chromium, chromium-driver); not fatal: without them that test skips and says why.
$(VENV)/.chromium: $(BIN)/capplan
	command -v chromium >/dev/null && command -v chromedriver >/dev/null || \
		{ (apt-get install -y -q chromium chromium-driver || \
		(apt-get update -q && apt-get install -y -q chromium chromium-driver) || \
		sudo -n apt-get install -y -q chromium chromium-driver) >/dev/null 2>&1 || \
		echo "chromium not installed: the HTML report's browser test will be skipped"; }
	touch $(VENV)/.chromium

# The simulator's loops are compiled into numba's cache (capplan.sim.precompile, ~1-2 min of
# one core on a fresh clone) while torch and chromium install, so the suite starts warm.
test: $(BIN)/capplan
	@$(BIN)/python -m capplan.sim.precompile & pid=$$!; \
		$(MAKE) --no-print-directory $(VENV)/.torch $(VENV)/.chromium; rc=$$?; \
		wait $$pid; exit $$rc
	$(BIN)/python -m pytest -q -n auto --maxprocesses 4 --dist loadfile

# The speed targets in one run (simulate 1M requests at 10/80/120% load, the loop compiled vs
# interpreted, recommend, start-up; several minutes), a day of ~1M requests replayed over a
# schedule of replicas, then the older speed benchmarks.
bench: $(BIN)/capplan
	$(BIN)/python benchmarks/bench_speed.py
	$(BIN)/python benchmarks/bench_fleet.py
	$(BIN)/python benchmarks/bench_perf.py
	$(BIN)/python benchmarks/bench_sim.py
	$(BIN)/python benchmarks/bench_search.py
	$(BIN)/python benchmarks/bench_replay.py
	$(BIN)/python benchmarks/bench_day.py

# Regenerate the tables in docs/ that validation scripts compute (blocks marked
# `<!-- generated: script:table -->`; tests/docs/test_generated_tables.py checks the fast ones).
validate: $(BIN)/capplan
	$(BIN)/python benchmarks/validate_perf.py --write-docs
	$(BIN)/python benchmarks/speculative_vllm.py --write-docs
	$(BIN)/python benchmarks/features_tables.py --write-docs
	$(BIN)/python benchmarks/published_prefill.py --write-docs
	$(BIN)/python benchmarks/validate_replay_screen.py --write-docs
	$(BIN)/python benchmarks/validate_silicon.py --loso --write-docs --write-bands
	$(BIN)/python benchmarks/validate_disagg.py --write-docs
	$(BIN)/python benchmarks/validate_saturation.py --write-docs
	$(BIN)/python benchmarks/silicon_ttft_split.py --sample 400 --write-docs
	$(BIN)/python benchmarks/silicon_prefill_slope.py --write-docs
	$(BIN)/python benchmarks/silicon_ttft_lead.py --cache /tmp/capplan-ttft-lead.pkl --write-docs
	$(BIN)/python benchmarks/accuracy_summary.py --write-docs

clean:
	rm -rf $(VENV) build dist *.egg-info

# Long property-based fuzz of every command's options and plan-file fields:
# randomised, CAPPLAN_FUZZ_EXAMPLES examples per property (default 2000; ~30-60 min on 2 cores).
fuzz: $(BIN)/capplan
	CAPPLAN_FUZZ_EXAMPLES=$${CAPPLAN_FUZZ_EXAMPLES:-2000} $(BIN)/python -m pytest -q tests/fuzz \
		--hypothesis-show-statistics -p no:cacheprovider
