# Every target creates .venv when it is missing; re-running is a no-op. `make verify` installs only
# requirements-core.txt (the library: a quicker first run); every other target the whole requirements.txt.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
CORE_STAMP := $(VENV)/.core-installed
STAMP := $(VENV)/.installed

.PHONY: docs verify test bench coverage train train-medusa train-eagle train-eagle3 clean-venv notebooks notebooks-render lab browser llama-cpp vllm openvino ortgenai mlx mistralrs

$(CORE_STAMP): requirements-core.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -r requirements-core.txt
	$(BIN)/python -m pip install --quiet --no-deps -e .
	touch $(CORE_STAMP)

$(STAMP): requirements.txt $(CORE_STAMP)
	$(BIN)/python -m pip install --quiet -r requirements.txt
	touch $(STAMP)

verify: $(CORE_STAMP)
	$(BIN)/specdec-lab verify $(ARGS)

# Rewrite the tables the README and docs quote from the committed results/ files (between <!-- results: ... -->
# markers; tests/test_docs.py fails when a page and its file disagree). A new run: copy its results.json into results/.
docs: $(CORE_STAMP)
	$(BIN)/python -m specdec_lab.report.docs

# Throughput vs HF generate / assisted generation, work per token, batch-1 latency, peak RSS
# (about 10 min on 2 cores; writes reports/bench/<timestamp>/bench.{md,json}). ARGS="--quick" for a smoke run,
# ARGS="--device cuda" on a GPU.
bench: $(STAMP)
	$(BIN)/python benchmarks/run.py $(ARGS)

# The coverage study of the 99% TV bound (docs/method.md#coverage-of-the-bound): every verify row's first-token
# and joint two-token laws, seven planted alternatives at three TVs, 2,000 replicates each, against the bound of
# the commit before the Hölder bound (404fc17) on 300 of them; writes reports/coverage/<timestamp>/. Not part of
# `make test` (which runs a 1,000-replicate version on two laws). ARGS="--reps 500" for a quicker look.
coverage: $(CORE_STAMP)
	OMP_NUM_THREADS=1 $(BIN)/python -m specdec_lab.coverage_study --baseline 404fc17 --joint-multiples 1.0 $(ARGS)

# The audit tests' real llama.cpp server: llama-cpp-python built for the CPU from its pinned sdist,
# and llama.cpp's HF -> GGUF converter extracted from the same sdist (see specdec_lab/adapters/llamacpp.py).
AUDIT_STAMP := $(VENV)/.audit-installed
$(AUDIT_STAMP): requirements-audit.txt $(STAMP)
	CMAKE_ARGS="-DGGML_BLAS=OFF -DGGML_CUDA=OFF -DLLAMA_CURL=OFF" CMAKE_BUILD_PARALLEL_LEVEL=2 \
		$(BIN)/python -m pip install --quiet -r requirements-audit.txt
	$(BIN)/python -m specdec_lab.adapters.llamacpp fetch-converter
	touch $(AUDIT_STAMP)

# llama.cpp's own llama-server, llama-speculative and llama-speculative-simple for the CPU (no BLAS, no HTTPS,
# no web UI), from the llama.cpp tree vendored in the same pinned sdist: built once per machine into
# ~/.cache/specdec-lab/llama.cpp-<pin> (outside the clone; a new pin builds anew; 28 min measured on 2 busy cores),
# reused by every later clone. The draft-model audit (tests/test_audit_llamacpp_draft.py) serves with it.
llama-cpp: $(STAMP)
	$(BIN)/python -m specdec_lab.adapters.llamacpp build-engine --jobs 2

# $(call engine_env,VENV,LOCK): an engine's own virtualenv holding exactly LOCK, installed without dependency resolution
define engine_env
test -x $(1)/bin/python || $(PYTHON) -m venv $(1)
$(1)/bin/python -m pip install --quiet --upgrade pip
$(1)/bin/python -m pip install --quiet --no-deps -r $(2)
touch $(1)/.installed
endef

# vLLM's CPU build in its own environment (it pins an older transformers; the main environment never imports
# vLLM): a complete lock installed without dependency resolution (see requirements-vllm.txt for why
# torchvision/torchaudio/torchcodec are left out). ≈ 3 min and 3.5 GB once; re-running is a no-op.
VLLM_VENV := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed
$(VLLM_STAMP): requirements-vllm.txt
	$(call engine_env,$(VLLM_VENV),requirements-vllm.txt)

vllm: $(VLLM_STAMP)

# OpenVINO GenAI in its own environment (optimum-intel, its IR exporter, pins an older transformers): a complete lock
# installed without dependency resolution (see requirements-openvino.txt). ≈ 1.6 GB once; re-running is a no-op.
OPENVINO_VENV := .venv-openvino
OPENVINO_STAMP := $(OPENVINO_VENV)/.installed
$(OPENVINO_STAMP): requirements-openvino.txt
	$(call engine_env,$(OPENVINO_VENV),requirements-openvino.txt)

openvino: $(OPENVINO_STAMP)

# ONNX Runtime GenAI in its own environment (its model builder needs torch and transformers): a complete lock installed
# without dependency resolution (see requirements-ortgenai.txt). ≈ 1.3 GB once; re-running is a no-op.
ORTGENAI_VENV := .venv-ortgenai
ORTGENAI_STAMP := $(ORTGENAI_VENV)/.installed
$(ORTGENAI_STAMP): requirements-ortgenai.txt
	$(call engine_env,$(ORTGENAI_VENV),requirements-ortgenai.txt)

ortgenai: $(ORTGENAI_STAMP)

# mlx-lm on MLX's CPU backend in its own environment (mlx-lm pulls a newer transformers): a complete lock installed
# without dependency resolution (see requirements-mlx.txt). ≈ 370 MB once; re-running is a no-op.
MLX_VENV := .venv-mlx
MLX_STAMP := $(MLX_VENV)/.installed
$(MLX_STAMP): requirements-mlx.txt
	$(call engine_env,$(MLX_VENV),requirements-mlx.txt)

mlx: $(MLX_STAMP)

# mistral.rs 0.6.0 in its own environment (a cp311 wheel without dependencies; see requirements-mistralrs.txt for why
# this release). ≈ 80 MB once; re-running is a no-op.
MISTRALRS_VENV := .venv-mistralrs
MISTRALRS_STAMP := $(MISTRALRS_VENV)/.installed
$(MISTRALRS_STAMP): requirements-mistralrs.txt
	$(call engine_env,$(MISTRALRS_VENV),requirements-mistralrs.txt)

mistralrs: $(MISTRALRS_STAMP)

# The interpreter of vLLM's environment for every target that may run it (tests, notebook 07, the browser test):
# $SPECDEC_LAB_VLLM_PYTHON if set, else $(VLLM_VENV) when built, else the per-machine cache .ci/run builds
# (~/.cache/specdec-lab/venv-vllm-<hash of the lock>), else $(VLLM_VENV) (notebook 07 then skips vLLM, saying why).
VLLM_CACHE_VENV := $(HOME)/.cache/specdec-lab/venv-vllm-$(shell sha256sum requirements-vllm.txt 2>/dev/null | cut -c1-16)
VLLM_PYTHON := $(firstword $(wildcard $(abspath $(VLLM_VENV))/bin/python $(VLLM_CACHE_VENV)/bin/python) \
	$(abspath $(VLLM_VENV))/bin/python)
ENGINES_ENV := SPECDEC_LAB_VLLM_PYTHON="$${SPECDEC_LAB_VLLM_PYTHON:-$(VLLM_PYTHON)}"

# Tests, doctests and the notebooks under nbval (--nbval-lax: every cell must run without error and
# every assert cell must hold; SPECDEC_LAB_SCALE=ci).
# pytest exits 5 when it collected no tests, so `make test` fails loudly if nothing ran.
NOTEBOOKS := $(wildcard notebooks/*.ipynb)
# The vLLM tests and notebook 07 run a real vLLM engine from $(VLLM_VENV) (.ci/run points VLLM_VENV at its
# per-machine cache). --durations: the slowest tests, so a suite that grows shows where.
# Two workers (pytest-xdist), each notebook and each test module whole on one of them (--dist loadscope: a
# notebook's cells share a kernel, a module its engines); one thread per process, as the two workers, their
# kernels and engine processes already fill the two cores.
test: $(STAMP) $(AUDIT_STAMP) llama-cpp $(VLLM_STAMP)
	$(ENGINES_ENV) OMP_NUM_THREADS=1 \
		$(BIN)/python -m pytest -q --strict-markers --durations=25 -n 2 --dist loadscope tests specdec_lab \
		$(if $(NOTEBOOKS),--nbval-lax $(NOTEBOOKS)) $(PYTEST_ARGS)

# The notebooks at full scale, executed top to bottom into HTML (about 15 min on 2 CPU cores).
notebooks: $(STAMP)
	mkdir -p reports/notebooks
	$(ENGINES_ENV) SPECDEC_LAB_SCALE=full $(BIN)/jupyter nbconvert --to html --execute --ExecutePreprocessor.timeout=3600 \
		--output-dir reports/notebooks $(NOTEBOOKS)

# The committed notebooks: each executed top to bottom in place at the small default scale (SPECDEC_LAB_SCALE=ci),
# so a reader on GitHub sees every figure and table (tests/test_notebooks_rendered.py checks the outputs come
# from one run, in order, without errors, and stay small). Run it after changing a notebook or what it calls
# (about 6 min on 2 cores); engines that are not built are skipped by notebook 07 with a message.
notebooks-render: $(STAMP)
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (ipykernel)" >/dev/null
	$(ENGINES_ENV) SPECDEC_LAB_SCALE=ci OMP_NUM_THREADS=1 PYTHONPATH="$(CURDIR)$${PYTHONPATH:+:$$PYTHONPATH}" \
		$(BIN)/jupyter nbconvert --to notebook --execute --inplace --ExecutePreprocessor.timeout=1800 \
		--ExecutePreprocessor.kernel_name=python3 --ExecutePreprocessor.record_timing=False $(NOTEBOOKS)

# JupyterLab on notebooks/, ready to run (scale ci unless SPECDEC_LAB_SCALE is set): the kernel
# "Python 3 (ipykernel)" the notebooks name is registered to this environment's Python, ipywidgets'
# lab extension comes with requirements.txt, and the lab opens on notebook 00. LAB_ARGS adds options.
lab: $(STAMP)
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (ipykernel)" >/dev/null
	$(ENGINES_ENV) $(BIN)/jupyter lab --ServerApp.root_dir=notebooks notebooks/00_worked_example.ipynb \
		$(if $(filter 0,$(shell id -u)),--allow-root) $(LAB_ARGS)

# Every notebook opened in JupyterLab in headless Chromium (all but 05, 07 and 09, which nbval runs, run there with Run
# All Cells), the calibrator's controls moved and checked (tests/test_browser.py, part of `make test`); keeps a
# screenshot of each figure and of the calibrator before and after the moves, and the 3-token explorer before and
# after, under reports/browser/ (2 min 27 s on 2 idle cores).
browser: $(STAMP)
	$(ENGINES_ENV) SPECDEC_LAB_SCREENSHOTS=reports/browser $(BIN)/python -m pytest -q tests/test_browser.py $(PYTEST_ARGS)

# Target, draft, then the Medusa, EAGLE and EAGLE-3 heads of the new target (training.base rewrites manifest.json; the
# heads' steps add their entries back, so the manifest always describes the heads that match the target).
train: $(STAMP)
	$(BIN)/python -m specdec_lab.training.base --out specdec_lab/bundled
	$(BIN)/python -m specdec_lab.training.medusa --out specdec_lab/bundled
	$(BIN)/python -m specdec_lab.training.eagle --out specdec_lab/bundled
	$(BIN)/python -m specdec_lab.training.eagle3 --out specdec_lab/bundled

# Medusa heads for the bundled target (after `make train`; ≈ 10 min on 2 idle cores)
train-medusa: $(STAMP)
	$(BIN)/python -m specdec_lab.training.medusa --out specdec_lab/bundled

# The EAGLE head for the bundled target, in vLLM's layout (after `make train`; ≈ 25 min on 2 shared cores)
train-eagle: $(STAMP)
	$(BIN)/python -m specdec_lab.training.eagle --out specdec_lab/bundled

# The EAGLE-3 head for the bundled target, in vLLM's layout (after `make train`; ≈ 15 min on 2 shared cores)
train-eagle3: $(STAMP)
	$(BIN)/python -m specdec_lab.training.eagle3 --out specdec_lab/bundled

clean-venv:
	rm -rf $(VENV)
