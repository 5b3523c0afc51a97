# Two commands for a newcomer: `make demo` shows the main job, `make test` runs the whole suite.
# Airflow 3.3 and Prefect 3.9 cannot share an environment (fastapi pins conflict), so there is one
# environment per orchestrator, both built from the one lock file (uv.lock).
SHELL := /bin/bash
PYTHON ?= python3
UV_VERSION := 0.13.9
UV := .tools/bin/uv
AIRFLOW_ENV := .venv-airflow
PREFECT_ENV := .venv-prefect
# The oldest supported Airflow and Prefect (pyproject's airflow-oldest / prefect-oldest groups), from the same lock.
AIRFLOW_OLDEST_ENV := .venv-airflow-oldest
PREFECT_OLDEST_ENV := .venv-prefect-oldest
PYTEST_ARGS ?=
DIST_DIR ?= dist
DOCS_OUT ?= .docs/html

.PHONY: help envs test test-fast test-prefect test-airflow demo bench chaos chaos-once lint docs dist clean
.PHONY: envs-oldest test-airflow-oldest test-prefect-oldest
.PHONY: test-airflow-stacks test-airflow-rest test-prefect-processes test-prefect-rest

help:
	@echo "make demo   - a local locks server and a Prefect server, the example DAGs and flows against them (DEMO_TIMEOUT=600)"
	@echo "make test   - run the whole test suite (builds both environments from uv.lock)"
	@echo "make test-fast - the fast tier only (pytest -m 'not slow'), in both environments"
	@echo "make test-prefect / test-airflow - one environment's whole suite; test-airflow-stacks, test-airflow-rest,"
	@echo "             test-prefect-processes, test-prefect-rest - one of make test's four lanes"
	@echo "make bench  - run every benchmark under bench/ and print their tables"
	@echo "make chaos  - the chaos suite (CHAOS_SECONDS=600 for a long run)"
	@echo "make chaos-once - the run-once chaos run, 10,000 duplicate attempts over 300 keys (README's figure)"
	@echo "make lint   - ruff and mypy"
	@echo "make docs   - build the docs site into $(DOCS_OUT) (warnings are errors, internal links resolved)"
	@echo "make dist   - build the wheel and sdist into dist/, with pip constraints for each extra"

$(UV):
	@echo ">> bootstrapping uv $(UV_VERSION) into .tools/ (one-off)"
	$(PYTHON) -m venv .tools
	.tools/bin/pip install --quiet uv==$(UV_VERSION)

$(AIRFLOW_ENV)/.synced: pyproject.toml uv.lock | $(UV)
	@echo ">> building the Airflow environment ($(AIRFLOW_ENV)) from uv.lock; the first time takes a minute or two"
	UV_PROJECT_ENVIRONMENT=$(AIRFLOW_ENV) $(UV) sync --frozen --extra airflow --extra server --extra fencing-sql --extra fencing-s3 \
	  --group airflow-celery --group airflow-newest
	touch $@

$(PREFECT_ENV)/.synced: pyproject.toml uv.lock | $(UV)
	@echo ">> building the Prefect environment ($(PREFECT_ENV)) from uv.lock; the first time takes a minute or two"
	UV_PROJECT_ENVIRONMENT=$(PREFECT_ENV) $(UV) sync --frozen --extra prefect --extra server --extra fencing-sql --extra fencing-s3 \
	  --group docs --group prefect-newest
	touch $@

$(AIRFLOW_OLDEST_ENV)/.synced: pyproject.toml uv.lock | $(UV)
	@echo ">> building the oldest supported Airflow's environment ($(AIRFLOW_OLDEST_ENV)) from uv.lock"
	UV_PROJECT_ENVIRONMENT=$(AIRFLOW_OLDEST_ENV) $(UV) sync --frozen --extra airflow --extra server --group airflow-oldest --no-group lint
	touch $@

$(PREFECT_OLDEST_ENV)/.synced: pyproject.toml uv.lock | $(UV)
	@echo ">> building the oldest supported Prefect's environment ($(PREFECT_OLDEST_ENV)) from uv.lock"
	UV_PROJECT_ENVIRONMENT=$(PREFECT_OLDEST_ENV) $(UV) sync --frozen --extra prefect --extra server --group prefect-oldest --no-group lint
	touch $@

envs-oldest: $(AIRFLOW_OLDEST_ENV)/.synced $(PREFECT_OLDEST_ENV)/.synced

envs: $(AIRFLOW_ENV)/.synced $(PREFECT_ENV)/.synced

# Static checks first, then four lanes side by side (each prints when it ends), each environment's suite in
# two halves: the Airflow full stacks (one stack at a time, as their timing checks need) and the rest of the
# Airflow tests (the triggerer fleets, the browser tests, everything in-process); the Prefect environment's
# process-heavy tests (end to end, chaos, packaging) and the rest of it (Prefect, core, server, fencing,
# docs, CLI). Most of their time is spent waiting for real (leases, quota minutes, fleets, full stacks):
# two suites side by side left the two cores half idle (vmstat: 51 % idle over a 38-minute run). The docs
# build and the oldest supported Airflow's and Prefect's focused subsets take the slot that frees first.
# AIRFLOW_STACK_TESTS are the lane of full stacks that time things (one at a time, the load they were tuned
# under); a stack that times nothing (the board's, run-once's) runs in test-airflow-rest. The contended
# runs' stack (test_full_stack.py) also checks the metrics and spans: one stack fewer on two cores.
AIRFLOW_STACK_TESTS := $(addprefix tests/airflow/,test_waits_stack.py test_fleet_stack.py \
  test_handoff_stack.py chaos/test_full_stack.py test_seal_stack.py test_full_stack.py test_celery_stack.py \
  test_triggerer_stack.py)
# The packaging tests (pip installs of the sdist and wheel, which time nothing) run last in their lane at a
# lower CPU priority (nice), so the lanes that time real waits keep the cores they need meanwhile.
# VOLCANO_TEST_NEIGHBOURS: the three other lanes are the CPU-bound neighbours of the tests that promise to
# hold on a busy machine (tests/support/busy.py), which start burners of their own only when run alone.
PREFECT_PACKAGING_TESTS := tests/packaging
PREFECT_PROCESS_TESTS := tests/e2e tests/chaos $(PREFECT_PACKAGING_TESTS)
test: envs envs-oldest lint
	VOLCANO_TEST_NEIGHBOURS=3 $(MAKE) --no-print-directory -j4 --output-sync=target test-airflow-stacks \
	  test-prefect-processes test-prefect-rest test-airflow-rest docs test-airflow-oldest test-prefect-oldest

test-airflow-stacks: envs
	$(AIRFLOW_ENV)/bin/python -m pytest $(AIRFLOW_STACK_TESTS) -q -p no:cacheprovider $(PYTEST_ARGS)

test-airflow-rest: envs
	$(AIRFLOW_ENV)/bin/python -m pytest tests/airflow $(addprefix --ignore=,$(AIRFLOW_STACK_TESTS)) -q \
	  -p no:cacheprovider $(PYTEST_ARGS)

test-prefect-processes: envs
	$(PREFECT_ENV)/bin/python -m pytest $(filter-out $(PREFECT_PACKAGING_TESTS),$(PREFECT_PROCESS_TESTS)) -q \
	  -p no:cacheprovider $(PYTEST_ARGS)
	nice -n 10 $(PREFECT_ENV)/bin/python -m pytest $(PREFECT_PACKAGING_TESTS) -q -p no:cacheprovider $(PYTEST_ARGS)

test-prefect-rest: envs
	$(PREFECT_ENV)/bin/python -m pytest tests --ignore=tests/airflow $(addprefix --ignore=,$(PREFECT_PROCESS_TESTS)) \
	  -q -p no:cacheprovider $(PYTEST_ARGS)

# The fast tier (tests/tiers.py): what runs in-process and waits for nothing real, in each environment in
# turn; under three minutes each on the two-core machine (CONTRIBUTING.md, "The tests").
test-fast: envs
	$(PREFECT_ENV)/bin/python -m pytest tests --ignore=tests/airflow -m "not slow" -q -p no:cacheprovider $(PYTEST_ARGS)
	$(AIRFLOW_ENV)/bin/python -m pytest tests/airflow -m "not slow" -q -p no:cacheprovider $(PYTEST_ARGS)

test-prefect: envs
	$(PREFECT_ENV)/bin/python -m pytest tests --ignore=tests/airflow -q -p no:cacheprovider $(PYTEST_ARGS)

test-airflow: envs
	$(AIRFLOW_ENV)/bin/python -m pytest tests/airflow -q -p no:cacheprovider $(PYTEST_ARGS)

# On the oldest supported versions (providers/volcano/docs/supported-versions.rst): provider registration,
# the trigger, the operator under dag.test() and a full deferral, the triggerer's prebuilt Execution API and
# the trigger's bounded Airflow calls; Prefect's block, locked_task and events, and the docs' locked snippets.
# (The trigger's tests last: their first one times its polls, which a cold first connection lookup delays.)
AIRFLOW_OLDEST_TESTS := tests/airflow/test_provider_info.py \
  tests/airflow/test_dags.py::test_every_dag_in_dags_folder_loads_and_is_tested \
  tests/airflow/test_dags.py::test_daily_rollup_writes_through_the_fence \
  tests/airflow/test_dags.py::test_migration_defers_while_held_from_outside_and_resumes_after_release \
  tests/airflow/test_dags.py::test_taskflow_pipeline_passes_the_fencing_token_downstream \
  tests/airflow/test_execution_api.py tests/airflow/test_airflow_calls.py \
  tests/airflow/test_triggers.py
PREFECT_OLDEST_TESTS := tests/prefect/test_credentials.py tests/prefect/test_decoration.py \
  tests/prefect/test_locked.py tests/prefect/test_events.py \
  tests/prefect/test_endings.py::test_every_ending_runs_clean tests/prefect/test_endings.py::test_every_example_runs_clean \
  tests/prefect/test_snippets.py
# Airflow 3.1's own code warns under the newer libraries the lock resolves (SQLAlchemy 2.1, starlette, the
# newest common-compat provider) and about its own Connection.from_json; those four warnings are ignored by
# the start of their message, every other warning stays an error.
AIRFLOW_OLDEST_WARNINGS := -W 'ignore:The `airflow.operators.:FutureWarning' \
  -W 'ignore:The ``noload`` loader strategy is deprecated:DeprecationWarning' \
  -W "ignore:'HTTP_422_UNPROCESSABLE_ENTITY' is deprecated:DeprecationWarning" \
  -W 'ignore:Using Connection.from_json from `airflow.models` is deprecated:DeprecationWarning'

test-airflow-oldest: envs-oldest
	$(AIRFLOW_OLDEST_ENV)/bin/python -m pytest $(AIRFLOW_OLDEST_TESTS) -q -p no:cacheprovider \
	  $(AIRFLOW_OLDEST_WARNINGS) $(PYTEST_ARGS)

test-prefect-oldest: envs-oldest
	$(PREFECT_OLDEST_ENV)/bin/python -m pytest $(PREFECT_OLDEST_TESTS) -q -p no:cacheprovider $(PYTEST_ARGS)

# The main job in one command: a local locks server, one Prefect server, the example DAGs and flows, two
# contenders each. DEMO_TIMEOUT: the longest it waits for any one step, in seconds (scripts/demo.py).
DEMO_TIMEOUT ?= 600
demo: envs
	$(PREFECT_ENV)/bin/python scripts/demo.py --timeout $(DEMO_TIMEOUT)

# Every benchmark under bench/, each printing its table (about half an hour: the waiting bench measures
# settled waiting for minutes, the Airflow one runs full stacks).
bench: envs
	$(PREFECT_ENV)/bin/python bench/bench_server.py
	$(PREFECT_ENV)/bin/python bench/bench_core.py
	$(PREFECT_ENV)/bin/python bench/bench_fencing.py
	$(PREFECT_ENV)/bin/python bench/bench_waiting.py
	$(PREFECT_ENV)/bin/python bench/bench_prefect.py
	$(AIRFLOW_ENV)/bin/python bench/bench_airflow.py

# The chaos run on its own (make test includes a short one): CHAOS_SECONDS=600 make chaos for ten minutes. It
# prints the model checker's verdict over every lock call of the run beside the interval and fencing counts.
chaos: envs
	$(PREFECT_ENV)/bin/python -m tests.chaos.run

# The run-once chaos run in full (make test runs a short one, tests/chaos/test_once_chaos.py): PostgreSQL on
# 127.0.0.1:5432 (or $$VOLCANO_TEST_POSTGRES_DSN), moto's S3 and a Prefect server are started by the run.
chaos-once: envs
	$(PREFECT_ENV)/bin/python -m tests.chaos.once_run --attempts 10000 --keys 300

# Static checks: ruff everywhere; mypy --strict on each package in the environment that can import it.
lint: envs
	$(PREFECT_ENV)/bin/ruff check .
	$(PREFECT_ENV)/bin/ruff format --check .
	$(PREFECT_ENV)/bin/mypy
	$(PREFECT_ENV)/bin/mypy --strict prefect_volcano
	$(AIRFLOW_ENV)/bin/mypy --strict airflow_provider_volcano

# The docs site (docs/conf.py): built from the repository root so the provider's pages stay in
# providers/volcano/docs; a fresh build every time (-E) so every page's warnings are seen; warnings are
# errors, every reference must resolve (-n), and external links are checked for form only (no internet).
docs: $(PREFECT_ENV)/.synced
	$(PREFECT_ENV)/bin/sphinx-build -E -W --keep-going -n -q -b html -c docs -d $(DOCS_OUT)/../doctrees . $(DOCS_OUT)
	@echo ">> docs built: $(DOCS_OUT)/index.html"

# What a user installs with plain pip (README, "Installing"): the sdist, the wheel built from it (so the sdist
# is known to build), and one pip constraints file per orchestrator extra with the versions uv.lock pins and
# the suite tested (constraints-<extra>.txt: the newest orchestrator; constraints-<extra>-oldest.txt: the
# oldest), covering the server and fencing extras too, so '[airflow,server]' is constrained as well.
# DIST_DIR=... builds elsewhere; the packaging tests do.
dist: | $(UV)
	rm -f $(DIST_DIR)/volcano_locks-* $(DIST_DIR)/constraints-*.txt
	$(UV) build --no-sources --out-dir $(DIST_DIR)
	for extra in airflow prefect; do \
	  $(UV) export --quiet --frozen --no-hashes --no-header --no-annotate --no-default-groups --no-emit-project \
	    --extra $$extra --extra server --extra fencing-sql --extra fencing-s3 \
	    --output-file $(DIST_DIR)/constraints-$$extra.txt || exit 1; \
	done
	for extra in airflow prefect; do \
	  $(UV) export --quiet --frozen --no-hashes --no-header --no-annotate --no-default-groups --no-emit-project \
	    --extra $$extra --extra server --group $$extra-oldest --output-file $(DIST_DIR)/constraints-$$extra-oldest.txt \
	    || exit 1; \
	done

clean:
	rm -rf .tools $(AIRFLOW_ENV) $(PREFECT_ENV) $(AIRFLOW_OLDEST_ENV) $(PREFECT_OLDEST_ENV) .demo .docs .pytest_cache .mypy_cache \
	  .ruff_cache $(DIST_DIR)
