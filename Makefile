# make demo : set up .venv and run the analysis on the bundled pretrained MiniLM-L6
# make test : set up .venv, lint (ruff), type-check (pyright), run the test suite (quick profile, ~10 min on 2 cores)
# make docs : build the docs site (guide, metrics, case studies, results, API reference) into
#             site/ with warnings as errors
# make test-all : the same with the long profiles (slow matrix-free golden cases, ...)
# make bench : rerun every table of benchmarks/RESULTS.md, quick forms (~40 min on 2 idle cores)
# make bench-full : the full forms the committed figures name (hours on 2 cores; gpu.py's
#                   Llama-3-8B shape needs a CUDA device, else it runs its small CPU form)
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-all lint typecheck docs setup clean bench bench-full

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e ".[tlens,demo,report,topology,logging,lightning,quantization,test,docs]"
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(BIN)/spectral-hooks analyze --jacobian --bottleneck --topology --out spectral_report

lint: $(STAMP)
	$(BIN)/ruff check .

typecheck: $(STAMP)
	$(BIN)/pyright --pythonpath $(BIN)/python

test: lint typecheck
	$(BIN)/python -m pytest -q -n 2 --dist loadfile --durations=15

docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

test-all: lint
	SPECTRAL_HOOKS_FULL=1 $(BIN)/python -m pytest -q -n 2 --dist loadfile

# each script prints its JSON lines / tables; results/*.md are the committed write-ups
BENCH := OMP_NUM_THREADS=1 $(BIN)/python
HAS_CUDA = $(shell $(BIN)/python -c "import torch; print(int(torch.cuda.is_available()))" 2>/dev/null)
GPU_FORM = $(if $(filter 1,$(HAS_CUDA)),,--device cpu --layers 2 --d-model 1024)

bench: $(STAMP)
	$(BENCH) benchmarks/cache_lookup.py
	$(BENCH) benchmarks/dense_threshold.py --widths 128 256 512
	$(BENCH) benchmarks/jacobian_spectra.py --quick
	$(BENCH) benchmarks/eigs_vs_arpack.py --quick
	$(BENCH) benchmarks/eigs_vs_arpack.py --llama --rounds 3
	$(BENCH) benchmarks/materialize_cost.py --quick
	$(BENCH) benchmarks/power_factored.py --quick
	$(BENCH) benchmarks/launch_budget.py --quick
	$(BENCH) benchmarks/host_bound.py --quick --check
	$(BENCH) benchmarks/training_overhead.py --model minilm --rounds 2
	$(BENCH) benchmarks/quantized.py memory --layers 2 --jacobian-layers 1 --tokens 32
	$(BENCH) benchmarks/quantized.py overhead --quick
	$(BENCH) benchmarks/distributed.py --quick
	$(BENCH) benchmarks/gpu.py --device cpu --layers 2 --d-model 1024 --tokens 128
	$(BENCH) benchmarks/recording_vs_tlens.py --quick
	$(BENCH) benchmarks/recording_cost.py --quick
	$(BENCH) benchmarks/hygiene.py

bench-full: $(STAMP)
	$(BENCH) benchmarks/cache_lookup.py
	$(BENCH) benchmarks/dense_threshold.py
	$(BENCH) benchmarks/jacobian_spectra.py
	$(BENCH) benchmarks/eigs_vs_arpack.py --quick
	$(BENCH) benchmarks/eigs_vs_arpack.py --llama --rounds 5
	$(BENCH) benchmarks/materialize_cost.py
	$(BENCH) benchmarks/power_factored.py --dense-8b
	$(BENCH) benchmarks/launch_budget.py
	$(BENCH) benchmarks/host_bound.py --check
	$(BENCH) benchmarks/training_overhead.py --model minilm --rounds 6
	$(BENCH) benchmarks/training_overhead.py --model gpt2-small --rounds 4 --batch 4
	$(BENCH) benchmarks/quantized.py memory
	$(BENCH) benchmarks/quantized.py memory --float-model --layers 4
	$(BENCH) benchmarks/quantized.py overhead --rounds 3
	$(BENCH) benchmarks/distributed.py
	$(BENCH) benchmarks/gpu.py $(GPU_FORM)
	$(BENCH) benchmarks/recording_vs_tlens.py
	$(BENCH) benchmarks/recording_cost.py
	$(BENCH) benchmarks/bottleneck_depths.py
	$(BENCH) benchmarks/bottleneck_end_to_end.py

clean:
	rm -rf $(VENV) spectral_report site
