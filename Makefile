# ddtree-fleet: every entry point an operator or CI needs. Run as root (the lab uses namespaces).
SHELL := /bin/bash
.DEFAULT_GOAL := help
VENV := .venv
PY := $(VENV)/bin/python
BIN := $(VENV)/bin
N ?=
# Lab slots: copies of the lab (ct129 + ct200) for lab tests run side by side (one per xdist worker).
SLOTS ?=
# Workers for the unit tests (they mostly wait on local servers and subprocesses).
UNIT_WORKERS ?= 4
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg
export ANSIBLE_HOME := $(CURDIR)/.ansible
export XDG_CACHE_HOME := /tmp/ddtree-fleet-cache
export PATH := $(CURDIR)/$(BIN):$(PATH)
export PIP_DISABLE_PIP_VERSION_CHECK := 1
APT_PACKAGES := systemd-container debootstrap iproute2 openssh-client patch python3-venv

.PHONY: help deps lab-deps venv lock host-lock lab-up lab-down lab-status demo test test-unit test-lab test-real gpu-check lint clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

lab-deps:  ## install the OS packages the lab and the tests need (apt, as root)
	@missing=""; for p in $(APT_PACKAGES); do dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "ok installed" || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then echo "apt: installing$$missing"; \
	  DEBIAN_FRONTEND=noninteractive apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; fi

# The toolchain installs from requirements.lock: every package, the dependencies too, pinned with
# its sha256 (--require-hashes; --no-deps so that nothing outside the lock comes in), then pip check.
$(VENV)/.stamp: requirements.lock
	python3 -m venv $(VENV)
	$(BIN)/pip install -q --require-hashes --no-deps -r requirements.lock
	$(BIN)/pip check
	touch $@

venv: $(VENV)/.stamp  ## create the pinned controller toolchain in .venv/ (from requirements.lock, hashes checked)

# requirements.lock is generated from requirements.txt (+ ee/requirements.txt); regenerate it after
# changing a pin (PyPI access; pip-tools runs in a throwaway venv).
PIP_TOOLS := pip-tools==7.7.0
lock:  ## regenerate requirements.lock (pins + sha256 of every package) from requirements.txt
	rm -rf /tmp/ddtree-fleet-lock && python3 -m venv /tmp/ddtree-fleet-lock
	/tmp/ddtree-fleet-lock/bin/pip install -q $(PIP_TOOLS)
	/tmp/ddtree-fleet-lock/bin/pip-compile -q --generate-hashes --allow-unsafe --strip-extras \
	  --no-emit-index-url --no-emit-find-links -o requirements.lock requirements.txt
	rm -rf /tmp/ddtree-fleet-lock

# The host venv's hash lock (role sglang, sglang_requirements_lock): sglang==$(SGLANG_VERSION) and
# every dependency pip resolves for it on $(HOST_PYTHON), each with the sha256 of its files on the
# public index. Resolved with pip's configuration and the machine's local wheel sources ignored,
# so the lock names what a GPU host downloads.
SGLANG_VERSION := 0.5.23
HOST_PYTHON ?= python3.11
HOST_LOCK := roles/sglang/files/locks/sglang-$(SGLANG_VERSION).txt
host-lock:  ## regenerate the host venv's hash lock, roles/sglang/files/locks/sglang-<version>.txt (PyPI access)
	rm -rf /tmp/ddtree-fleet-host-lock && $(HOST_PYTHON) -m venv /tmp/ddtree-fleet-host-lock
	env -u PIP_FIND_LINKS -u PIP_CONSTRAINT PIP_CONFIG_FILE=/dev/null \
	  /tmp/ddtree-fleet-host-lock/bin/pip install -q $(PIP_TOOLS)
	echo "sglang==$(SGLANG_VERSION)" > /tmp/ddtree-fleet-host-lock/sglang.in
	env -u PIP_FIND_LINKS -u PIP_CONSTRAINT PIP_CONFIG_FILE=/dev/null \
	  /tmp/ddtree-fleet-host-lock/bin/pip-compile -q --generate-hashes --allow-unsafe --strip-extras \
	  --no-emit-index-url --no-emit-find-links -o /tmp/ddtree-fleet-host-lock/lock.txt /tmp/ddtree-fleet-host-lock/sglang.in
	sed 's%^\(#    \)pip-compile .*%\1make host-lock  (sglang==$(SGLANG_VERSION); pip-tools, see the Makefile)%' \
	  /tmp/ddtree-fleet-host-lock/lock.txt > $(HOST_LOCK)
	rm -rf /tmp/ddtree-fleet-host-lock

deps: lab-deps venv

lab-up: deps  ## boot ct129 + ct200 (N=8: also lab03..lab08; SLOTS=3: two more copies for parallel tests) and seed known-good NEXTN
	$(PY) lab/labctl.py up $(if $(N),--hosts $(N))
	bash lab/seed.sh
	$(if $(SLOTS),$(PY) lab/labctl.py up $(if $(N),--hosts $(N)) --slots $(SLOTS))

lab-down:  ## stop the lab (every host, also lab03.. of N=) and remove everything it made
	python3 lab/labctl.py down

lab-status:  ## show the lab hosts
	python3 lab/labctl.py status

demo: lab-up  ## set up, boot the lab, run deploy_ddtree.yml on it, print what happened
	bash lab/demo.sh

test: lab-deps  ## set up, then run every test (unit, lint, the real-stack tier, lab integration, molecule): what CI runs
	bash tests/run_all.sh

test-unit: venv  ## only the unit tests (no lab, no root; about a minute): run them after every change
	$(BIN)/pytest -q -n $(UNIT_WORKERS) tests/unit

test-real: lab-deps  ## only the real-stack tier: the patched DDTREE worker under the real sglang 0.5.23 + torch on CPU (installs its cached venv, ~6 min the first time)
	@venv=$$(bash tests/real/setup.sh) && "$$venv/bin/python" -m pytest -q -p no:cacheprovider -W ignore tests/real

test-lab: lab-deps  ## only the lab tests: boot the lab slots, lab integration + molecule, lab down
	bash tests/run_all.sh lab

gpu-check: venv  ## on a GPU host: DDTREE vs its target alone, greedy parity token by token and tokens/s (PYTHON= MODEL= DRAFT= [BUDGET=] [ARGS=])
	$(BIN)/python bin/ddtree-gpu-check --python "$(PYTHON)" --model-path "$(MODEL)" --draft-model-path "$(DRAFT)" --budget "$(or $(BUDGET),0)" $(ARGS)

lint: venv  ## yamllint + ansible-lint (production profile) + ansible-doc and ansible-test validate-modules for every module
	$(BIN)/yamllint -s .
	$(BIN)/ansible-lint --profile production
	@for m in plugins/modules/*.py; do n=$$(basename $$m .py); $(BIN)/ansible-doc -t module ddtree.fleet.$$n >/dev/null || exit 1; done; echo "ansible-doc: all modules documented"
	bash tests/sanity/validate_modules.sh

clean: lab-down
	rm -rf $(VENV) .ansible artifacts
