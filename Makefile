# Two commands on a fresh machine:
#   make serve   set up .venv with what serving needs, build the demo models, serve them on 127.0.0.1:8000
#   make test    set up .venv with the test and bench extras too, and run the whole test suite
# As root, `make test-systemd` also runs ringserve under a real systemd in a container (tests/systemd/).
VENV   ?= .venv
PYTHON ?= python3
PY      = $(VENV)/bin/python
HASH    = $(shell cat pyproject.toml constraints.txt | sha1sum | cut -c1-12)
# Every install takes the versions CI has run (constraints.txt).
PIP_INSTALL = $(PY) -m pip install -q -c constraints.txt
SERVE_STAMP = $(VENV)/.installed-serve-$(HASH)
TEST_STAMP  = $(VENV)/.installed-test-$(HASH)
MODELS ?= models
HOST   ?= 127.0.0.1
PORT   ?= 8000
GRPC_PORT ?= 8001
# The demo holds requests up to 5 s while a worker restarts, so that killing the worker fails
# nothing (the README's promise). The server's default is 503 + Retry-After at once, which is
# what a load balancer in front of several replicas wants.
SERVE_FLAGS ?= --hold-when-unavailable-s 5

LOAD   ?= 2

.PHONY: setup setup-serve serve check test test-bench test-container test-loaded test-systemd test-perf-analyzer test-triton-qa bench clean

setup: $(TEST_STAMP)
setup-serve: $(SERVE_STAMP)

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

$(SERVE_STAMP): pyproject.toml constraints.txt | $(VENV)/bin/python
	$(PIP_INSTALL) -e '.[text]'
	rm -f $(VENV)/.installed-serve-* && touch $@

$(TEST_STAMP): pyproject.toml constraints.txt | $(VENV)/bin/python
	$(PIP_INSTALL) -e '.[test,bench,check,text]'
	rm -f $(VENV)/.installed-* && touch $@ $(SERVE_STAMP)

$(MODELS)/.built: | $(SERVE_STAMP)
	$(VENV)/bin/ringserve demo-models --text $(MODELS)
	touch $@

# Prints the URL once /v2/health/ready answers 200, while the server runs in the foreground
# (the poller gives up when the server, which takes over this shell's pid with exec, is gone).
serve: $(SERVE_STAMP) $(MODELS)/.built
	@( while kill -0 $$$$ 2>/dev/null; do \
	     $(PY) -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=1)' \
	       http://$(HOST):$(PORT)/v2/health/ready 2>/dev/null \
	     && { echo "ringserve is ready: http://$(HOST):$(PORT), gRPC $(HOST):$(GRPC_PORT)  (models: $(MODELS); status: $(VENV)/bin/ringserve status --url http://$(HOST):$(PORT))"; exit 0; }; \
	     sleep 0.5; done ) & \
	exec $(VENV)/bin/ringserve serve --model-repository $(MODELS) --host $(HOST) --port $(PORT) --grpc-port $(GRPC_PORT) $(SERVE_FLAGS)

# Style and types: ruff (format check, lint) and mypy over CHECK_PACKAGES: the whole product.
CHECK_PACKAGES ?= gateway common worker shm supervision cli supervisor.py tritonserver.py
# mypy sees the repository root as the package `ringserve` through a symlink in a temp dir on
# MYPYPATH: the editable install's finder is invisible to static tools.
check: $(TEST_STAMP)
	$(VENV)/bin/ruff format --check $(CHECK_PACKAGES)
	$(VENV)/bin/ruff check $(CHECK_PACKAGES)
	@tmp=$$(mktemp -d) && ln -s "$(CURDIR)" "$$tmp/ringserve" && \
	  mods=$$(for p in $(CHECK_PACKAGES); do case $$p in *.py) echo "-m ringserve.$${p%.py}";; *) echo "-p ringserve.$$p";; esac; done) && \
	  ( cd "$$tmp" && MYPYPATH="$$tmp" "$(CURDIR)/$(VENV)/bin/mypy" --config-file "$(CURDIR)/pyproject.toml" $$mods ); \
	  rc=$$?; rm -rf "$$tmp"; exit $$rc

# The suite, without the bench's own tests (`make test-bench`); the 25 slowest tests are listed at the end.
test: $(TEST_STAMP)
	$(PY) -m pytest --ignore=tests/bench --ignore=tests/container --durations=25

# The bench's own tests (tests/bench/): its parsers and reports, and each suite run --quick against a real
# stack (~3 min). .ci/run runs it after `make test`.
test-bench: $(TEST_STAMP)
	$(PY) -m pytest tests/bench --durations=10

# Triton's own sequence-batcher QA, every case that runs without Triton's internal hooks (~25 min on 2 cores;
# `make test` runs one repository of each kind): tests/integration/test_triton_sequence_qa.py.
test-triton-qa: $(TEST_STAMP)
	RINGSERVE_TRITON_QA=all $(PY) -m pytest tests/integration/test_triton_sequence_qa.py -m triton_qa -q -p no:cacheprovider

# The suite with LOAD busy loops beside it: a slower, shared CI machine, here. Timing-dependent
# tests that pass only on an idle machine fail this.
test-loaded: $(TEST_STAMP)
	@pids=""; for i in $$(seq $(LOAD)); do $(PY) -c 'while 1: pass' & pids="$$pids $$!"; done; \
	$(PY) -m pytest --ignore=tests/bench --ignore=tests/container; rc=$$?; kill $$pids; exit $$rc

# The CPU image built and run for real (tests/container/run.sh; root and a Docker engine, which it starts from
# Debian's docker.io where none runs; ~10 min, most of it debootstrap and the build): exit 77 = cannot run here.
test-container: $(TEST_STAMP)
	PY=$(PY) tests/container/run.sh

# The units under a real systemd: a debootstrap-ed Debian booted with systemd-nspawn, ringserve
# installed as the README says (tests/systemd/realsd.sh; root, the Debian mirror and PyPI; a few
# minutes). KEEP_ROOTFS=1 keeps the root file system in build/systemd for the next run.
test-systemd:
	tests/systemd/realsd.sh

# Every perf_analyzer mode a Triton user runs, against a real stack (tests/perf_analyzer/; ~2 min).
# perf_analyzer is installed into build/perf_analyzer when missing (bench/perf_analyzer.py: PyPI and
# the Debian mirror of this machine's apt sources); exit 77 where it cannot be.
test-perf-analyzer: $(TEST_STAMP)
	PY=$(PY) tests/perf_analyzer/run.sh

bench: $(TEST_STAMP)
	$(PY) -m bench

clean:
	rm -rf $(VENV) $(MODELS) build *.egg-info
