# Development tasks of ctxsum and its example project. `make run` serves the demo with its
# task worker, `make test` runs the test suite (SQLite; set DATABASE_URL for PostgreSQL),
# `make mutants` the mutation run, `make lint` ruff and mypy, `make package-check` a real install of the package into a new
# project.

.PHONY: venv demo-venv run test mutants lint check bench replay-check package-check docs docs-site screenshots

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

DEMO_STAMP := $(VENV)/.installed-demo

venv: $(STAMP)

# What the tests, the checks and the benchmarks use; reinstalled only when pyproject.toml
# changes.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@ $(DEMO_STAMP)

# What `make run` needs: ctxsum and the example project's two packages, no dev tools.
demo-venv: $(DEMO_STAMP)

$(DEMO_STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet -e '.[demo]'
	touch $@

# The web server and, beside it, a task worker that runs the background compactions
# (manage.py db_worker); Ctrl-C stops both, and so does the web server's exit.
run: demo-venv
	$(BIN)/python manage.py migrate
	$(BIN)/python manage.py ctxsum_demo
	$(BIN)/python manage.py db_worker --no-reload & worker=$$!; \
	trap 'kill $$worker 2>/dev/null; wait $$worker 2>/dev/null' EXIT; \
	$(BIN)/python manage.py runserver 127.0.0.1:8000

# CTXSUM_TEST_PROFILE (tests/profiles.py, docs/testing.md): dev, the default, leaves the
# tests marked slow out and runs the property suites at a quarter of their examples; ci runs
# every test at full size, as .ci/run does. PYTEST_ARGS="-m slow" runs only the slow tests.
CTXSUM_TEST_PROFILE ?= dev
test: venv
	CTXSUM_TEST_PROFILE=$(CTXSUM_TEST_PROFILE) $(BIN)/pytest \
		$(if $(filter ci,$(CTXSUM_TEST_PROFILE)),,-m "not slow") $(PYTEST_ARGS)

# The mutation run (docs/testing.md, "Mutation testing"): every mutant of
# tests/support/mutants.py, a worker a CPU, each in a copy of the checkout. With DATABASE_URL
# naming a PostgreSQL database the PostgreSQL mutants run too; MUTANTS_ARGS="--only NAME"
# runs one.
MUTANTS_ARGS ?=
mutants: venv
	$(BIN)/python -m tests.support.mutants $(MUTANTS_ARGS)

# mypy checks what [tool.mypy] names in pyproject.toml: ctxsum and the example project;
# lint-imports the import contracts of [tool.importlinter].
lint: venv
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/lint-imports

# A real (not editable) install of the package into a new project, in a temporary folder.
package-check:
	bash .ci/package-check

check: venv
	$(BIN)/python manage.py check
	$(BIN)/python manage.py makemigrations --check --dry-run

# docs/api.md, written from real requests on a new database (in memory), and
# docs/reference/rest-api.md, from the OpenAPI document; the tests fail when either no longer
# matches what the requests answer or what the document says.
docs: venv
	DATABASE_URL=sqlite://:memory: $(BIN)/python manage.py ctxsum_api_docs
	$(BIN)/python manage.py ctxsum_rest_reference

# The documentation site (mkdocs.yml) in site/, built strictly as CI builds it (.ci/docs):
# a broken link or anchor, or a docstring the Python API reference cannot read, fails it.
# `.venv/bin/mkdocs serve` serves it while you write.
docs-site: venv
	$(BIN)/mkdocs build --strict --site-dir site

# The pictures of the admin and the chat page (README, docs/), taken by the headless-browser tests
# (Debian's chromium and chromium-driver); the test suite itself writes them to a temporary
# folder.
screenshots: venv
	SCREENSHOTS_DIR=docs/images $(BIN)/pytest tests/test_admin_browser.py tests/test_chat_page.py

bench: venv
	$(BIN)/python -m bench.replay

# Every real conversation with every check after every step (CI replays a part of it with
# the invariants after every 10th step and every compaction: docs/testing.md, "CI").
replay-check: venv
	$(BIN)/python -m bench.replay --check
