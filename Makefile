# trimq developer commands. `make test` and `make run` work from a fresh clone:
# each (re)creates .venv when it is missing or older than pyproject.toml.
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
RUN_STAMP  := $(VENV)/.stamp-run
TEST_STAMP := $(VENV)/.stamp-test

NAMESRV_ADDR ?= 127.0.0.1:9876
BROKER_LISTEN ?= 127.0.0.1:10911
STORE_DIR ?= ./.trimq

.PHONY: run test lint typecheck unit bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(RUN_STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e .
	touch $@

$(TEST_STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[dev,spark]'
	touch $@ $(RUN_STAMP)

# One NameServer and one broker on loopback; Ctrl-C stops both cleanly.
run: $(RUN_STAMP)
	@BIN=$(BIN) NAMESRV_ADDR=$(NAMESRV_ADDR) BROKER_LISTEN=$(BROKER_LISTEN) STORE_DIR=$(STORE_DIR) deploy/run-local.sh

lint: $(TEST_STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check namesrv broker remoting store client tests bench
	$(BIN)/mypy

test: lint
	$(BIN)/python -m pytest

unit: $(TEST_STAMP)
	$(BIN)/python -m pytest -m unit

bench: $(TEST_STAMP)
	$(BIN)/python bench/remoting_rtt.py
	$(BIN)/python bench/store_append.py

clean:
	rm -rf $(VENV) .trimq .pytest_cache .mypy_cache .ruff_cache build dist
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
