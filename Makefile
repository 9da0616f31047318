# kvforge developer targets. `make setup` makes .venv; everything else runs inside it.
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
PYTEST  := $(BIN)/python -m pytest
KVFORGE := $(BIN)/kvforge

.PHONY: setup setup-amd demo generate check test test-gpu bench clean

setup: $(BIN)/kvforge

$(BIN)/kvforge: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e ".[cuda,hip,dev]"
	@touch $@

# The AMD compilers the HIP variants are checked with (Debian packages; needs root). Without them
# HIP compile tests skip, saying so.
AMD_PACKAGES := clang-19 lld-19 llvm-19 hipcc libamdhip64-dev libamdhip64-5 libhiprtc-builtins5 libamd-comgr2 rocm-device-libs
setup-amd:
	@command -v clang-19 >/dev/null && command -v llvm-objdump-19 >/dev/null && ls /usr/lib/x86_64-linux-gnu/libamdhip64.so.5 >/dev/null 2>&1 \
	  || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(AMD_PACKAGES) >/dev/null)

# The main job on the built-in matrix: generate, compile, and on a GPU run, check and time.
demo: setup
	$(KVFORGE) demo --out generated

generate: setup
	$(KVFORGE) generate --out generated

# generated/ is fresh, every variant compiles with NVRTC, and the vendorable sources with nvcc.
check: setup
	$(KVFORGE) generate --check --out generated
	$(KVFORGE) compile
	$(BIN)/python -m kvforge.codegen.vendor_check generated

test: setup
	$(PYTEST) -q

# On a GPU machine: the gpu-marked tests only, in GPU_WORKERS processes sharing the GPU (pytest-xdist:
# the variants compile in parallel; the whole suite takes about 5 minutes on an H200 host with 16 cores).
# KVFORGE_DEBUG_BARRIERS=1 in the environment bounds every barrier wait (a stuck pipeline traps, saying where).
GPU_WORKERS ?= 8
test-gpu: setup
	$(PYTEST) -q -m gpu -n $(GPU_WORKERS) --timeout=300

bench: setup
	$(BIN)/python bench/bench.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .hypothesis
	-$(KVFORGE) cache clear 2>/dev/null
