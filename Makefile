# Every target creates .venv from requirements.txt when it is missing; re-running is a no-op.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: verify test bench train train-medusa clean-venv notebooks lab vllm

$(STAMP): requirements.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -r requirements.txt
	$(BIN)/python -m pip install --quiet --no-deps -e .
	touch $(STAMP)

verify: $(STAMP)
	$(BIN)/specdec-lab verify $(ARGS)

# Throughput vs HF generate / assisted generation, work per token, batch-1 latency, peak RSS
# (about 10 min on 2 cores; writes reports/bench/<timestamp>/bench.{md,json}). ARGS="--quick" for a smoke run,
# ARGS="--device cuda" on a GPU.
bench: $(STAMP)
	$(BIN)/python benchmarks/run.py $(ARGS)

# The audit tests' real llama.cpp server: llama-cpp-python built for the CPU from its pinned sdist,
# and llama.cpp's HF -> GGUF converter extracted from the same sdist (see specdec_lab/adapters/llamacpp.py).
AUDIT_STAMP := $(VENV)/.audit-installed
$(AUDIT_STAMP): requirements-audit.txt $(STAMP)
	CMAKE_ARGS="-DGGML_BLAS=OFF -DGGML_CUDA=OFF -DLLAMA_CURL=OFF" CMAKE_BUILD_PARALLEL_LEVEL=2 \
		$(BIN)/python -m pip install --quiet -r requirements-audit.txt
	$(BIN)/python -m specdec_lab.adapters.llamacpp fetch-converter
	touch $(AUDIT_STAMP)

# vLLM's CPU build in its own environment (it pins an older transformers; the main environment never imports
# vLLM): a complete lock installed without dependency resolution (see requirements-vllm.txt for why
# torchvision/torchaudio/torchcodec are left out). ≈ 3 min and 3.5 GB once; re-running is a no-op.
VLLM_VENV := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed
$(VLLM_STAMP): requirements-vllm.txt
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install --quiet --no-deps -r requirements-vllm.txt
	touch $(VLLM_STAMP)

vllm: $(VLLM_STAMP)

# Tests, doctests and the notebooks under nbval (--nbval-lax: every cell must run without error and
# every assert cell must hold; SPECDEC_LAB_SCALE=ci).
# pytest exits 5 when it collected no tests, so `make test` fails loudly if nothing ran.
NOTEBOOKS := $(wildcard notebooks/*.ipynb)
test: $(STAMP) $(AUDIT_STAMP)
	$(BIN)/python -m pytest -q --strict-markers tests specdec_lab $(if $(NOTEBOOKS),--nbval-lax $(NOTEBOOKS)) $(PYTEST_ARGS)

# The notebooks at full scale, executed top to bottom into HTML (about 15 min on 2 CPU cores).
notebooks: $(STAMP)
	mkdir -p reports/notebooks
	SPECDEC_LAB_SCALE=full $(BIN)/jupyter nbconvert --to html --execute --ExecutePreprocessor.timeout=3600 \
		--output-dir reports/notebooks $(NOTEBOOKS)

# JupyterLab on notebooks/, ready to run (scale ci unless SPECDEC_LAB_SCALE is set).
lab: $(STAMP)
	$(BIN)/jupyter lab --notebook-dir=notebooks

# Target, draft, then the Medusa heads of the new target (train.py rewrites manifest.json; the heads'
# step adds its entry back, so the manifest always describes the heads that match the target).
train: $(STAMP)
	$(BIN)/python -m specdec_lab.train --out data/models
	$(BIN)/python -m specdec_lab.medusa_train --out data/models

# Medusa heads for the bundled target (after `make train`; ≈ 10 min on 2 idle cores)
train-medusa: $(STAMP)
	$(BIN)/python -m specdec_lab.medusa_train --out data/models

clean-venv:
	rm -rf $(VENV)
