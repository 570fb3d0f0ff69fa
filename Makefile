# Every target creates .venv from requirements.txt when it is missing; re-running is a no-op.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: verify test bench train clean-venv

$(STAMP): requirements.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -r requirements.txt
	$(BIN)/python -m pip install --quiet --no-deps -e .
	touch $(STAMP)

verify: $(STAMP)
	$(BIN)/specdec-lab verify $(ARGS)

# Tests, doctests and (once notebooks/ has any) the notebooks under nbval.
# pytest exits 5 when it collected no tests, so `make test` fails loudly if nothing ran.
NOTEBOOKS := $(wildcard notebooks/*.ipynb)
test: $(STAMP)
	$(BIN)/python -m pytest -q --strict-markers tests specdec_lab $(if $(NOTEBOOKS),--nbval $(NOTEBOOKS)) $(PYTEST_ARGS)

train: $(STAMP)
	$(BIN)/python -m specdec_lab.train --out data/models

clean-venv:
	rm -rf $(VENV)
