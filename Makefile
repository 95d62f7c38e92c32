# pfl — `make train` and `make test` are all a fresh machine needs.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
METHOD ?= fedavg
ARGS   ?=
STAMP  := $(VENV)/.installed

.PHONY: install train test lint bench clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[dev]"
	touch $(STAMP)

train: install
	$(PY) -m pfl fit --config conf/default.yaml --config conf/method/$(METHOD).yaml $(ARGS)

test: install
	$(PY) -m pytest tests -q

lint: install
	$(VENV)/bin/ruff check pfl tests bench
	$(VENV)/bin/ruff format --check pfl tests bench

# Overhead vs plain PyTorch, scaling with N, per-method cost (~3 min on 2 cores); docs/performance.md
bench: install
	$(PY) -m bench.run

clean:
	rm -rf runs wandb .pytest_cache
