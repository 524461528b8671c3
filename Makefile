# m4ray: `make run` sets up and runs the main job; `make test` sets up and runs the tests.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)
ARGS ?=
PYTEST_ARGS ?=

.PHONY: setup run datagen train test test-all bench lint format clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	@# Chakra ET reader/writer; its declared deps (~100 packages of notebooks and plotting) are
	@# not needed for the protobuf schema and protolib we use (reference/workloads.md §1.5)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps mlc-chakra==1.0.0
	@rm -f $(VENV)/.installed-*
	@touch $(STAMP)

run: setup  ## the default gray-failure sweep on an embedded local Ray
	$(BIN)/python -m m4ray.sweeps +experiment=gray_failure $(ARGS)

datagen: setup  ## a small m4 training dataset (16 ns-3 scenarios, ~30 s) in outputs/datagen
	$(BIN)/python -m m4ray.sweeps +experiment=datagen $(ARGS)

train: datagen  ## train m4 on that dataset (Ray Train, 2 CPU workers, MLflow in outputs/train)
	$(BIN)/python -m m4ray.sweeps +experiment=train $(ARGS)

test: setup  ## the default test suite (slow cases excluded)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

test-all: setup  ## every test, slow ones included
	$(BIN)/python -m pytest -m "" $(PYTEST_ARGS)

bench: setup  ## performance tables (numbers live here, not in tests)
	$(BIN)/python bench/flowsim_speed.py
	$(BIN)/python bench/ns3_speed.py --quick
	$(BIN)/python bench/datagen_speed.py
	$(BIN)/python bench/workload_speed.py
	$(BIN)/python bench/m4_speed.py
	$(BIN)/python bench/serve_speed.py

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: setup
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

clean:
	rm -rf outputs .pytest_cache .ruff_cache
