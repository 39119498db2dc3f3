# Development tasks of ctxsum and its example project. `make run` serves the demo,
# `make test` runs the test suite (SQLite; set DATABASE_URL for PostgreSQL).

.PHONY: venv run test lint check bench

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
ROOT := $(patsubst %/,%,$(dir $(abspath $(lastword $(MAKEFILE_LIST)))))
PYTEST_ARGS ?=

# tiktoken downloads its encodings on first use; use the offline cache beside the checkout
# when there is one and TIKTOKEN_CACHE_DIR is not set already.
SHARED_TIKTOKEN := $(abspath $(ROOT)/../shared/tiktoken)
ifeq ($(origin TIKTOKEN_CACHE_DIR),undefined)
ifneq ($(wildcard $(SHARED_TIKTOKEN)/.),)
export TIKTOKEN_CACHE_DIR := $(SHARED_TIKTOKEN)
endif
endif

venv: $(STAMP)

# Reinstalled only when pyproject.toml changes.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@

run: venv
	$(BIN)/python manage.py migrate
	$(BIN)/python manage.py ctxsum_demo
	$(BIN)/python manage.py runserver 127.0.0.1:8000

test: venv
	$(BIN)/pytest $(PYTEST_ARGS)

lint: venv
	$(BIN)/ruff check .

check: venv
	$(BIN)/python manage.py check
	$(BIN)/python manage.py makemigrations --check --dry-run

bench: venv
	$(BIN)/python bench/replay.py
