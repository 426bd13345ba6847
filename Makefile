# The README's two commands are the contract: `make run` and `make test` set everything up on a fresh machine.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
DATA_DIR ?= ./var

.PHONY: run test lint typecheck pytest bench clean alerts chaos

# The venv is rebuilt when missing or when the dependency pins change (stale).
$(STAMP): pyproject.toml constraints.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e '.[test]'
	@touch $(STAMP)

run: $(STAMP)
	PODCAST_JOB_DATA_DIR=$${PODCAST_JOB_DATA_DIR:-$(DATA_DIR)} $(VENV)/bin/supervisor serve

lint: $(STAMP)
	$(VENV)/bin/ruff check supervisor pipeline_runner tests tools bench
	$(PY) tools/lint_timeouts.py supervisor pipeline_runner

typecheck: $(STAMP)
	$(VENV)/bin/mypy

pytest: $(STAMP)
	$(VENV)/bin/pytest $(PYTEST_ARGS)

test: lint typecheck pytest

# The long chaos run: 300 jobs while the supervisor is SIGKILLed and restarted 50 times (not in `make test`).
chaos: $(STAMP)
	$(PY) bench/chaos.py

bench: $(STAMP)
	$(PY) bench/run.py
	$(PY) bench/feeds.py
	$(PY) bench/outbox.py

# The alert rules and their unit tests (promtool comes with Debian's prometheus package; .ci/run installs it).
alerts:
	promtool check rules docs/alerts/podcast-supervisor.rules.yml
	promtool test rules docs/alerts/podcast-supervisor.rules.test.yml

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache
