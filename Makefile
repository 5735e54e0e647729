# README's quick path starts with `make venv` (the venv alone) and `make api-key`; every target
# builds .venv from uv.lock on first use and reuses it afterwards.

PYTHON ?= python3
UV_VERSION := 0.13.9
VENV := .venv
BIN := $(VENV)/bin

.PHONY: help venv api-key demo demo-day2 demo-tune pve-demo test lint typecheck unit e2e bench clean samples

# `make` alone lists the targets: the first rule is the default one.
help:
	@echo "make venv         build .venv from uv.lock (and nothing else)"
	@echo "make api-key      make locks/api.key (mode 600): the key inventory/ct200.py's clients send"
	@echo "make demo         preview a deploy on a simulated CT200 (pyinfra --dry; nothing is contacted)"
	@echo "make demo-day2    the same CT200 already serving 0.5.11: --dry shows no change, then"
	@echo "                  0.5.19 with a canary first (the default), then rolled, then its status"
	@echo "make demo-tune    a tune previewed on that CT200 (--dry): the rank, the candidates, the time"
	@echo "make pve-demo     preview pve.py on a simulated Proxmox node (what it would change)"
	@echo "make test         what CI runs: lint, typecheck and every test layer (about 30 min)"
	@echo "make lint         ruff check and ruff format --check"
	@echo "make typecheck    mypy (strict)"
	@echo "make fast         the tests that start no process (about 30 s)"
	@echo "make integration  the unit tests that start pyinfra, uv, systemd-analyze or a host program"
	@echo "make unit         fast and integration together"
	@echo "make e2e          end-to-end runs in systemd containers over SSH (root, systemd-nspawn)"
	@echo "make bench        the paired benchmarks in bench/ (docs: bench/README.md)"
	@echo "make samples      regenerate docs/samples/ from the simulated hosts"
	@echo "make clean        remove .venv and the tools' caches"
	@echo "Each target builds .venv from uv.lock on first use."

# Bytecode at install: every pyinfra run imports ~500 modules, and where .pyc files are never
# written (PYTHONDONTWRITEBYTECODE, a read-only checkout) compiling them costs ~0.7 s a run.
$(BIN)/.synced: uv.lock pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check "uv==$(UV_VERSION)"
	VIRTUAL_ENV=$(abspath $(VENV)) $(BIN)/uv sync --frozen --active --quiet --compile-bytecode
	touch $@

venv: $(BIN)/.synced
	@echo "venv: $(VENV) is ready ($(BIN)/pyinfra, $(BIN)/python)"

# The API key inventory/ct200.py names (SGLANG_API_KEY_FILE overrides it): made once, never
# replaced (rotating it is writing a new key into the file and deploying).
API_KEY_FILE ?= locks/api.key
api-key: $(BIN)/.synced
	@$(BIN)/python -m operations.cli.api_key $(API_KEY_FILE)

demo: $(BIN)/.synced
	$(BIN)/pyinfra inventory/demo.py deploy.py --dry

# A simulated CT200 the deploy already converged (inventory/demo_day2.py): no change, a pin
# change (a canary first, the default on a serving host), the same rolled, and what status shows.
demo-day2: $(BIN)/.synced
	$(BIN)/pyinfra inventory/demo_day2.py deploy.py --dry

# A tune previewed on the same simulated CT200 (docs/tune.md): the rank, the candidates, the time.
demo-tune: $(BIN)/.synced
	$(BIN)/python -m operations.tune inventory/demo_day2.py --dry
	$(BIN)/pyinfra inventory/demo_day2.py deploy.py --dry --data sglang_version=0.5.19
	$(BIN)/pyinfra inventory/demo_day2.py deploy.py --dry --data sglang_version=0.5.19 \
		--data 'rollout={"strategy": "rolling"}'
	$(BIN)/python -m operations.status inventory/demo_day2.py

# pve.py against a simulated Proxmox node (inventory/pve_demo.py): what it would change.
pve-demo: $(BIN)/.synced
	$(BIN)/pyinfra inventory/pve_demo.py pve.py --dry

lint: $(BIN)/.synced
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(BIN)/.synced
	$(BIN)/mypy

# The layers (docs/how-it-works/faults-and-tests.md, "Tests, by layer"): fast (pure logic and pyinfra fixtures,
# no process started), integration (unit tests that start pyinfra, uv, systemd-analyze or a host
# script), unit (both), e2e (systemd containers over SSH). `make test` runs them all.
.PHONY: fast integration
fast: $(BIN)/.synced
	$(BIN)/python -m pytest -p tests.spawn_audit -m "not e2e and not integration"

integration: $(BIN)/.synced
	$(BIN)/pytest -m "integration and not e2e"

unit: $(BIN)/.synced
	$(BIN)/pytest -m "not e2e"

e2e: $(BIN)/.synced
	$(BIN)/pytest -m e2e

test: lint typecheck
	$(BIN)/pytest

bench: $(BIN)/.synced
	@for b in bench/*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

# The docs' samples (docs/samples/), as the programs print them on the simulated hosts;
# tests/unit/test_doc_samples.py fails when one differs.
samples: $(BIN)/.synced
	$(BIN)/python scripts/gen_doc_samples.py

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
