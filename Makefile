# distro: the two commands of the README and a few helpers.
#
#   make demo      install missing Debian packages, build the GPT trainer, run
#                  its --compare: AdamW all-reduce vs DisTrO vs DisTrO-AdamW on
#                  real text (three runs)
#   make demo-full the same with every row: DeMo's reference setting, DiLoCo,
#                  streaming DiLoCo, SparseLoCo (eight runs)
#   make test      install missing Debian packages, build, run every test
#   make bench     build and run the benchmarks in build/bench/
#   make install PREFIX=/opt/distro
#   make clean
#
# Variables: BUILD (build dir), PREFIX, JOBS, WERROR (ON when CI is set),
# CMAKE_FLAGS (extra configure flags), CTEST_FLAGS.

BUILD       ?= build
PREFIX      ?= /usr/local
JOBS        ?= $(shell nproc 2>/dev/null || echo 2)
WERROR      ?= $(if $(CI),ON,OFF)
CMAKE       ?= cmake
CTEST       ?= ctest
CMAKE_FLAGS ?=
CTEST_FLAGS ?=

# Everything the build, the tests and the demo use, on Debian 12.
# python3-torch and python3-venv serve the Python package's test
# (python_package; skipped without them): 145 MB of archives, 632 MB
# installed, about 2.5 minutes to install.
DEBIAN_PACKAGES := cmake gcc g++ make pkg-config libopenblas-dev libfftw3-dev \
                   libopenmpi-dev openmpi-bin libzmq3-dev libcriterion-dev \
                   gnuplot-nox fortunes clang libclang-rt-14-dev iproute2
# What only the tests add: the Python package's suite (skipped without them).
TEST_PACKAGES   := python3-torch python3-venv

# Targets run one after another, in the order given (deps before build).
.NOTPARALLEL:
MAKEFLAGS += --no-print-directory
.PHONY: all deps test-deps install-packages configure build test demo demo-build demo-full bench install clean

all: build

deps:
	@$(MAKE) install-packages PACKAGES="$(DEBIAN_PACKAGES)"

test-deps:
	@$(MAKE) install-packages PACKAGES="$(DEBIAN_PACKAGES) $(TEST_PACKAGES)"

install-packages:
	@if ! command -v dpkg-query >/dev/null 2>&1; then \
	  echo "deps: not a Debian system; make sure these (or equivalents) are installed:"; \
	  echo "  $(PACKAGES)"; exit 0; \
	fi; \
	missing=""; \
	for p in $(PACKAGES); do \
	  dpkg-query -W -f='$${Status}' "$$p" 2>/dev/null | grep -q 'install ok installed' \
	    || missing="$$missing $$p"; \
	done; \
	if [ -z "$$missing" ]; then echo "deps: all Debian packages present"; exit 0; fi; \
	echo "deps: missing:$$missing"; \
	if [ "$$(id -u)" = 0 ]; then \
	  set -e; \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-get update; \
	  apt-get install -y --no-install-recommends $$missing; \
	else \
	  echo "deps: not root; install them with:"; \
	  echo "  sudo apt-get install -y$$missing"; \
	  exit 1; \
	fi

configure:
	$(CMAKE) -S . -B $(BUILD) -DDISTRO_WERROR=$(WERROR) $(CMAKE_FLAGS)

build: configure
	$(CMAKE) --build $(BUILD) -j $(JOBS)

test: test-deps build
	$(CTEST) --test-dir $(BUILD) --output-on-failure $(CTEST_FLAGS)

GPT_TRAIN := $(BUILD)/python-free-examples/gpt/gpt-train

# The demo builds only what it runs (the library and the trainer).
demo-build: deps configure
	@if [ ! -f python-free-examples/gpt/main.c ]; then \
	  echo "demo: python-free-examples/gpt is not part of this checkout" >&2; exit 1; \
	fi
	$(CMAKE) --build $(BUILD) -j $(JOBS) --target gpt-train

demo: demo-build
	@mkdir -p $(BUILD)/demo
	$(GPT_TRAIN) --compare --plot $(BUILD)/demo/compare.png --log $(BUILD)/demo/compare.csv --tsv $(BUILD)/demo/compare.tsv

demo-full: demo-build
	@mkdir -p $(BUILD)/demo
	$(GPT_TRAIN) --compare-all --plot $(BUILD)/demo/compare-all.png --log $(BUILD)/demo/compare-all.csv --tsv $(BUILD)/demo/compare-all.tsv

bench: build
	@found=0; \
	for b in $(BUILD)/bench/bench_*; do \
	  [ -f "$$b" ] && [ -x "$$b" ] || continue; \
	  found=1; echo "== $$b"; "$$b" || exit 1; \
	done; \
	if [ $$found = 0 ]; then echo "bench: no benchmarks in $(BUILD)/bench/" >&2; exit 1; fi

install: build
	$(CMAKE) --install $(BUILD) --prefix $(PREFIX)

clean:
	rm -rf $(BUILD)
