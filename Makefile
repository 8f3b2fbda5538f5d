# Seedkeeper: `make help` lists the targets.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
IAM_NODE := tests/iam/node
IAM_STAMP := $(IAM_NODE)/node_modules/.installed
TS_CLIENT := clients/typescript
TS_STAMP := $(TS_CLIENT)/node_modules/.installed

.DEFAULT_GOAL := help
.PHONY: help setup setup-python system-packages node-packages test unit lint format pr clean demo docs client-ts sam-validate image docker-packages lambda-image sam-cli sam-local-build

help: ## List the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-16s %s\n", $$1, $$2}'

setup: setup-python $(IAM_STAMP) $(TS_STAMP) ## What setup-python makes, and the node packages of the IAM check's evaluator and the TypeScript client; install node (>= 20) and npm if missing

setup-python: $(STAMP) ## Create .venv with the project, the Python client and the dev tools; install git, squashfs-tools and python3-venv if missing

# Installs the Debian packages named in $$missing (with apt-get, as root), or says which
# to install.
define apt-install
if [ -n "$$missing" ]; then \
  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
    echo "installing$$missing with apt-get"; \
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
  else \
    echo "please install:$$missing (apt-get needs root here)" >&2; exit 1; \
  fi; \
fi
endef

# The Debian packages of the commands missing here: $(call apt-packages,command:package ...).
# /usr/sbin counts too: a user's PATH may not have it.
define apt-packages
	@missing=""; \
	for wanted in $(1); do \
	  command -v "$${wanted%%:*}" >/dev/null || test -x "/usr/sbin/$${wanted%%:*}" \
	    || missing="$$missing $${wanted##*:}"; \
	done; \
	$(apt-install)
endef

# git and squashfs-tools are system tools the slot task and the tests run for real.
# `$(PYTHON) -m venv` needs ensurepip, which Debian and Ubuntu ship apart (python3-venv).
system-packages:
	$(call apt-packages,git:git unsquashfs:squashfs-tools)
	@missing=""; $(PYTHON) -c 'import ensurepip' 2>/dev/null || missing=" python3-venv"; \
	$(apt-install)

# node runs the suite's IAM evaluator (tests/iam) and the TypeScript client, which needs
# node >= 20 (its package.json's engines; aws4fetch signs with the global crypto.subtle).
# Debian 12's nodejs is 18.
node-packages:
	$(call apt-packages,node:nodejs npm:npm)
	@node -e 'process.exit(process.versions.node.split(".")[0] >= 20 ? 0 : 1)' || { \
	  echo "node $$(node --version) is too old: node >= 20 is needed (Debian 13's nodejs," \
	    "or NodeSource's: https://github.com/nodesource/distributions)" >&2; exit 1; }

# The executor's client (clients/python) is a distribution of its own, which the project
# depends on (the slot task signs its calls with the client's transport): pip takes it
# from its folder when one command installs both.
$(STAMP): pyproject.toml clients/python/pyproject.toml | system-packages
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]' -e clients/python
	touch $@

# The suite's IAM evaluator (@cloud-copilot/iam-simulate, AGPL: a dev-only tool the tests
# run in a node process of their own), exactly as package-lock.json pins it.
$(IAM_STAMP): $(IAM_NODE)/package-lock.json | node-packages
	npm ci --prefix $(IAM_NODE) --no-audit --no-fund --silent
	touch $@

# The documentation site: strict, so a broken link or anchor fails the build. Its hooks
# (docs/hooks) generate the reference from the functions' OpenAPI documents and the CLI's
# help, and plot the benchmarks' JSON. mkdocs-material 9.8 prints an end-of-life banner
# for mkdocs 2 unless told not to.
DOCS_STAMP := $(VENV)/.docs-installed
$(DOCS_STAMP): pyproject.toml $(STAMP)
	$(BIN)/pip install --quiet -e '.[docs]'
	touch $@

docs: $(DOCS_STAMP) ## Build the documentation site into site/ (mkdocs build --strict)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

# The TypeScript client's packages (aws4fetch; tsc), exactly as package-lock.json pins them;
# npm ci also builds dist/ (the package's prepare script). `make test` runs its tests
# against the local stack (tests/e2e/test_typescript_client.py).
$(TS_STAMP): $(TS_CLIENT)/package-lock.json $(TS_CLIENT)/package.json | node-packages
	npm ci --prefix $(TS_CLIENT) --no-audit --no-fund --silent
	touch $@

client-ts: setup ## Build the TypeScript client (tsc) and run its tests: node --test, then against the local stack
	npm test --prefix $(TS_CLIENT)
	$(BIN)/pytest tests/e2e/test_typescript_client.py $(PYTEST_ARGS)

# The slot task's image (functions/seed_task/Dockerfile) as SLOT_IMAGE; the container
# tests build it the same way. Its base: the public Python 3.13 slim image, or one made
# from Debian 13's packages (debootstrap) where no registry answers.
SLOT_IMAGE ?= seedkeeper-slot-task:local

image: setup-python docker-packages ## Build the slot task image (needs a running Docker engine) and report its size
	@docker info >/dev/null 2>&1 || { echo "no Docker engine answers: start dockerd (as root: dockerd &)" >&2; exit 1; }
	SLOT_IMAGE=$(SLOT_IMAGE) images/slot-task

# Docker's engine and debootstrap (for the Debian-made base), from Debian's packages.
docker-packages:
	$(call apt-packages,dockerd:docker.io debootstrap:debootstrap)

demo: setup-python ## Run the whole protocol locally (local stack, real git, real slot tasks), checked step by step
	$(BIN)/seedkeeper demo

# The whole suite runs in TEST_WORKERS processes (pytest-xdist; 0: in this one). Its tests
# share nothing across processes: tmp_path data directories, ports the OS picks, fresh
# table and bucket names, slot uids counted from a base of each process's own. Many tests
# wait on subprocesses and sockets, so 3 workers beat 2 on a 2-core machine; worksteal
# evens out the few long tests. PYTEST_ARGS: more options, e.g. --durations=20.
TEST_WORKERS ?= 3
PYTEST_ARGS ?=

test: setup ## Run the whole test suite (unit, integration, e2e), in parallel
	$(BIN)/pytest -n $(TEST_WORKERS) --dist worksteal $(PYTEST_ARGS)

unit: setup-python ## Run the network-free unit tests (tests/unit) only: seconds
	$(BIN)/pytest tests/unit $(PYTEST_ARGS)

# mypy checks the docs' hooks too, so it needs the docs extra (mkdocs, matplotlib).
lint: setup-python $(DOCS_STAMP) checkov-cli ## ruff (lint and format check), mypy, and checkov on template.yaml (offline; .checkov.yaml lists each skip and why)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(CHECKOV_VENV)/bin/checkov --config-file .checkov.yaml

# checkov pins its own boto3 and networkx: it gets its own virtualenv, at a pinned version
# (a newer one brings new checks).
CHECKOV_VENV := .checkov-venv

.PHONY: checkov-cli
checkov-cli: system-packages
	test -x $(CHECKOV_VENV)/bin/checkov || { $(PYTHON) -m venv $(CHECKOV_VENV) && $(CHECKOV_VENV)/bin/pip install --quiet 'checkov==3.3.30'; }

format: setup-python ## Apply ruff's fixes and formatting
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

pr: lint docs test ## Everything a change must pass before it lands

# The working-day soak runs SOAK_MINUTES (10: about 13 minutes in all; 1 for a quick look).
SOAK_MINUTES ?= 10

bench: setup-python bench-packages docker-packages ## Benchmark the restore, the checkpoint and the resume (three links, 1 and 2 vCPU), imports, sweep, API calls, a container seed, the slot image, the time to the first command, a working day on the local stack
	$(BIN)/python benchmarks/restore.py --sizes "1 GB" "300 MB" --rounds 5 --plain-up-to "300 MB"
	$(BIN)/python benchmarks/checkpoint.py --sizes 1000 300
	$(BIN)/python benchmarks/resume.py --sizes "300 MB" --rounds 5
	$(BIN)/python benchmarks/imports.py
	$(BIN)/python benchmarks/sweep.py
	$(BIN)/python benchmarks/calls.py
	$(BIN)/python benchmarks/container.py
	$(BIN)/python benchmarks/image.py --before-ref 3a0f7e2  # the slot image before it was slimmed: the base with apt's git added, perl and all
	$(BIN)/python benchmarks/first_command.py
	$(BIN)/python benchmarks/soak.py --minutes $(SOAK_MINUTES)

# nginx serves the benchmark's archives; curl and aria2c are the baselines' downloaders,
# openssl their sha256 and the link's certificate, zstd and tar the checkpoint's baselines;
# ip and tc (iproute2) make the capped HTTPS link, cc compiles its delay line; skopeo and
# docker-registry the image benchmark's push and pull.
.PHONY: bench bench-packages
bench-packages:
	$(call apt-packages,nginx:nginx curl:curl aria2c:aria2 openssl:openssl zstd:zstd ip:iproute2 tc:iproute2 cc:gcc skopeo:skopeo docker-registry:docker-registry)

clean: ## Remove what the targets make: the virtualenvs (.venv, .checkov-venv, .sam-venv), the IAM evaluator's and the TypeScript client's node_modules (and its dist), site/, build/, .aws-sam and the tools' caches
	rm -rf $(VENV) $(CHECKOV_VENV) $(SAM_VENV) $(IAM_NODE)/node_modules $(TS_CLIENT)/node_modules $(TS_CLIENT)/dist site build .aws-sam .mypy_cache .ruff_cache .pytest_cache

# SAM CLI pins an old boto3: it gets its own virtualenv. `sam build` needs a python3.13.
SAM_VENV := .sam-venv
PY313 := $(firstword $(wildcard $(HOME)/.pyenv/versions/3.13*/bin/python3.13) $(shell command -v python3.13))

sam-cli: system-packages ## The SAM CLI in .sam-venv (and a check for the python3.13 `sam build` needs)
	@test -n "$(PY313)" || { echo "sam build needs a python3.13 on this machine" >&2; exit 1; }
	test -x $(SAM_VENV)/bin/sam || { $(PYTHON) -m venv $(SAM_VENV) && $(SAM_VENV)/bin/pip install --quiet aws-sam-cli; }

sam-validate: setup-python sam-cli ## cfn-lint, sam validate --lint and sam build (SAM CLI in .sam-venv)
	$(BIN)/cfn-lint template.yaml
	SAM_CLI_TELEMETRY=0 $(SAM_VENV)/bin/sam validate --lint
	SAM_CLI_TELEMETRY=0 PATH=$(dir $(PY313)):$$PATH $(SAM_VENV)/bin/sam build

lambda-image: setup-python docker-packages ## The Lambda Python 3.13 base image `sam local invoke` runs in (public, or a stand-in)
	images/lambda-python

SAM_LOCAL := build/sam-local

sam-local-build: setup-python sam-cli ## sam build the functions for `sam local invoke` on this machine (build/sam-local)
	$(BIN)/seedkeeper sam-template $(SAM_LOCAL)/template.json
	LAYER_ARCHITECTURE=$$($(BIN)/python -c 'from seedkeeper_tools.sam_env import lambda_architecture; print(lambda_architecture())') \
	  SAM_CLI_TELEMETRY=0 PATH=$(dir $(PY313)):$$PATH $(SAM_VENV)/bin/sam build \
	  -t $(SAM_LOCAL)/template.json --build-dir $(SAM_LOCAL)/build
