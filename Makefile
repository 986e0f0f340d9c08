# Two commands on a fresh machine:
#   make serve   set up .venv, build the demo models, serve them on 127.0.0.1:8000
#   make test    set up .venv and run the whole test suite
VENV   ?= .venv
PYTHON ?= python3
PY      = $(VENV)/bin/python
STAMP   = $(VENV)/.installed-$(shell sha1sum pyproject.toml | cut -c1-12)
MODELS ?= models
HOST   ?= 127.0.0.1
PORT   ?= 8000

LOAD   ?= 2

.PHONY: setup serve test test-loaded bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,bench]'
	rm -f $(VENV)/.installed-* && touch $(STAMP)

$(MODELS)/.built: $(STAMP)
	$(VENV)/bin/ringserve demo-models $(MODELS)
	touch $@

serve: $(MODELS)/.built
	$(VENV)/bin/ringserve serve --model-repository $(MODELS) --host $(HOST) --port $(PORT)

test: $(STAMP)
	$(PY) -m pytest

# The suite with LOAD busy loops beside it: a slower, shared CI machine, here. Timing-dependent
# tests that pass only on an idle machine fail this.
test-loaded: $(STAMP)
	@pids=""; for i in $$(seq $(LOAD)); do $(PY) -c 'while 1: pass' & pids="$$pids $$!"; done; \
	$(PY) -m pytest; rc=$$?; kill $$pids; exit $$rc

bench: $(STAMP)
	$(PY) -m bench

clean:
	rm -rf $(VENV) $(MODELS) build *.egg-info
