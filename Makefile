# The README's two commands are the contract: `make run` and `make test` set everything up on a fresh machine.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
DATA_DIR ?= ./var
# The benchmarks' own venv (RQ, py-spy): never the project's dependencies.
BENCH_VENV := .venv-bench

.PHONY: run test lint typecheck pytest bench soak chaos alerts clean

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
	$(PY) tools/lint_timeouts.py supervisor pipeline_runner bench tests/longrun

typecheck: $(STAMP)
	$(VENV)/bin/mypy

# The tests marked `docker` share one engine, which some of them stop and start (scripts/docker-engine.sh down/up) or
# fill with a compose stack: they run one after another, in a pytest of their own. Every other test keeps to its own
# temporary directory, ports, schema or database session, and they run on two pytest-xdist workers. The two runs go
# side by side: both mostly wait (on the engine, on real processes and servers), and one after the other they took
# most of make test's ten minutes. The docker run's output is shown after the other's; each run's exit status counts
# (5, no test collected, fails too). (Not one run with `--dist loadgroup`: with pytest 9, pytest-xdist 3.8's group
# suffix no longer reaches the node ids, and the groups are not kept together.)
# `make test PYTEST_WORKERS=0` runs everything in one process.
PYTEST_WORKERS ?= 2
DOCKER_TESTS_LOG := $(VENV)/docker-tests.log
pytest: $(STAMP)
ifeq ($(PYTEST_WORKERS),0)
	$(VENV)/bin/pytest $(PYTEST_ARGS)
else
	@$(VENV)/bin/pytest -m docker -p no:cacheprovider $(PYTEST_ARGS) > $(DOCKER_TESTS_LOG) 2>&1 & docker=$$!; \
	$(VENV)/bin/pytest -m "not docker" -n $(PYTEST_WORKERS) $(PYTEST_ARGS); others=$$?; \
	wait $$docker; docker_status=$$?; \
	echo "== the docker tests (run beside the others) =="; cat $(DOCKER_TESTS_LOG); \
	echo "pytest exit status: docker tests $$docker_status, the others $$others"; \
	[ $$others -eq 0 ] && [ $$docker_status -eq 0 ]
endif

test: lint typecheck pytest

# The long chaos runs (ADR 0009; not in `make test`, which runs a short one per mode): in subprocess and then Docker
# mode, 1,000 jobs while the supervisor is SIGKILLed and restarted 200 times and running jobs are SIGKILLed from
# outside, their kind resubmitting them (3 attempts); checked against the jobs' own journal, the registry and the API.
# Each mode takes several minutes. Results: bench/results/<date>-<mode>-chaos.json; figures in docs/reliability.md.
# Docker mode starts the engine first (scripts/docker-engine.sh up). Options through CHAOS_ARGS, e.g.
#   make chaos CHAOS_ARGS="--mode subprocess --jobs 300 --kills 50 --seed 7"
# (--mode subprocess|docker|both, --jobs, --kills, --slots, --seed, --job-kill-every-s; see tests/longrun/chaos.py).
# A fleet (ADR 0012): CHAOS_HOSTS=3 runs that many supervisors on a fresh schema of a PostgreSQL server
# (--database-url in CHAOS_ARGS, or $$PODCAST_JOB_TEST_DATABASE_URL), in subprocess mode, SIGKILLing any of them:
#   make chaos CHAOS_HOSTS=3 CHAOS_ARGS="--jobs 400 --kills 80 --seed 27 --job-kill-every-s 0.3"
# The fleet upgraded host by host at full size (a minute of each mix of releases; make test runs a small one):
#   .venv/bin/pytest --longrun tests/core/test_core_fleet_upgrade.py
CHAOS_ARGS ?=
CHAOS_HOSTS ?= 1
chaos: $(STAMP)
	$(if $(findstring subprocess,$(CHAOS_ARGS))$(filter-out 1,$(CHAOS_HOSTS)),,bash scripts/docker-engine.sh up)
	$(PY) tests/longrun/chaos.py $(if $(filter-out 1,$(CHAOS_HOSTS)),--hosts $(CHAOS_HOSTS)) $(CHAOS_ARGS)

# Installs the peers (Debian task-spooler, redis-server, parallel; RQ, py-spy and matplotlib into $(BENCH_VENV)) when
# missing, runs every benchmark into one dated results file (bench/results/, kept while a page cites it), then
# renders docs/performance.md and its plot from the latest results (bench/fleet.py starts a PostgreSQL cluster of its
# own with scripts/postgres.sh, which installs Debian's postgresql when missing). A full run takes several minutes; it
# needs a quiet machine. `make bench LABEL=before-issue-24` names the run in its results file.
BENCH_RESULTS := bench/results/$(shell date -u +%Y-%m-%dT%H%MZ)-make-bench.json
bench: $(STAMP)
	PYTHON=$(PYTHON) BENCH_VENV=$(BENCH_VENV) bash bench/install-peers.sh
	BENCH_VENV=$(BENCH_VENV) $(PY) bench/run.py --results $(BENCH_RESULTS) $(if $(LABEL),--label "$(LABEL)")
	$(PY) bench/feeds.py --results $(BENCH_RESULTS)
	$(PY) bench/outbox.py --results $(BENCH_RESULTS)
	bash scripts/docker-engine.sh up
	$(PY) bench/exec_modes.py --results $(BENCH_RESULTS)
	$(PY) bench/fleet.py --results $(BENCH_RESULTS)
	$(PY) bench/pooler.py --results $(BENCH_RESULTS)
	PODCAST_JOB_TEST_DATABASE_URL= $(PY) bench/migration.py --results $(BENCH_RESULTS)
	py=$(BENCH_VENV)/bin/python; [ -x "$$py" ] || py=$(PY); "$$py" bench/report.py

# The alert rules and their unit tests (promtool comes with Debian's prometheus package; .ci/run installs it).
alerts:
	promtool check rules docs/alerts/podcast-supervisor.rules.yml
	promtool test rules docs/alerts/podcast-supervisor.rules.test.yml

# An hour of `supervisor serve` under a workload; fails if descriptors, threads or RSS grow (docs/performance.md). Not in `test`.
# Its results go to bench/results/<date>-soak.json; pass --plot docs/img/soak-<date>.png to show its plot on the page.
# matplotlib (for the plot) goes into the venv only here: it is no dependency of the project.
SOAK_ARGS ?= --duration-s 3600 --table-step-s 300 --csv $(DATA_DIR)/soak.csv --plot $(DATA_DIR)/soak.png
soak: $(STAMP)
	@$(PY) -c 'import matplotlib' 2>/dev/null || $(PY) -m pip install --quiet matplotlib
	@mkdir -p $(DATA_DIR)
	$(PY) tests/longrun/soak.py $(SOAK_ARGS)

clean:
	rm -rf $(VENV) $(BENCH_VENV) .mypy_cache .pytest_cache .ruff_cache
