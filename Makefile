# dask-ddp: the commands a developer and CI run. `make demo` and `make test` each set up
# what they need (apt packages, the Python environment, the C++ build) on a fresh machine.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

ROOT := $(CURDIR)
PY := $(ROOT)/.venv/bin/python
CMAKE := $(ROOT)/.venv/bin/cmake
BUILD ?= build/dev
ASAN_BUILD ?= build/asan
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=
# The package is imported from the source tree; the C++ module is built beside it.
export PYTHONPATH := $(ROOT)/src$(if $(PYTHONPATH),:$(PYTHONPATH))
# The environment's tools first (cmake, ninja and ctest come from PyPI into it).
export PATH := $(ROOT)/.venv/bin:$(PATH)
# The compiler cache (ccache, from tools/setup_apt.sh), kept outside the clone as the Python
# environment is: a fresh clone, CI's clean clone and CI's four builds (dev, ASan, fuzz,
# wheel) compile only what changed since they last ran on this machine. Paths under the clone
# are hashed relative to it (CCACHE_BASEDIR) and the build directory is left out of the hash
# (CCACHE_NOHASHDIR: debug info may name another clone's build directory), so any clone hits.
# CMake reads the launcher variables when it first configures a build directory. Given to
# the build recipes only (not to the GPU check, which rehearses a bare machine).
CCACHE_DIR ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/dask-ddp/ccache
WITH_CCACHE := $(if $(shell command -v ccache 2>/dev/null),CCACHE_DIR=$(CCACHE_DIR) \
	CCACHE_BASEDIR=$(ROOT) CCACHE_NOHASHDIR=1 CCACHE_MAXSIZE=5G \
	CMAKE_C_COMPILER_LAUNCHER=ccache CMAKE_CXX_COMPILER_LAUNCHER=ccache)

# What `make test-quick` leaves out: tests that start a LocalCluster, a server or are slow
# (the markers are applied from the fixtures a test uses: tests/conftest.py).
QUICK_MARKERS := not dask and not s3 and not server and not slow
# Setup (apt packages, the Python environment, the dev install) runs again only when one of
# these changed since it last ran, or the environment is gone.
SETUP_INPUTS := tools/setup_apt.sh tools/setup_venv.sh pyproject.toml
SETUP_STAMP := $(BUILD)/.setup-stamp

.PHONY: help setup apt venv build develop test test-quick test-cpp test-py asan lint stubs demo \
	bench bench-deps fuzz clean sdist wheel check-wheel stress docs gpu-bundle gpu-check \
	gpu-check-sim

help:
	@echo "make demo       - set up, then train on a local Dask cluster (the embedded default)"
	@echo "make test       - set up, then the C++ tests (CTest) and the whole pytest suite"
	@echo "make test-quick - the C++ tests and the Python tests that start no cluster or server"
	@echo "make setup      - apt packages, the Python environment, the C++ build (what changed)"
	@echo "make asan       - build and run the C++ tests under ASan+UBSan"
	@echo "make stress     - the launch, results and chaos tests 20 times beside a CPU hog (not CI)"
	@echo "make fuzz       - build the libFuzzer targets and run each a share of FUZZ_SECONDS (60)"
	@echo "make lint       - ruff, mypy and the import layers (import-linter)"
	@echo "make stubs      - regenerate src/dask_ddp/_core.pyi after changing bindings/"
	@echo "make docs       - the documentation site in build/docs/html (warnings are errors)"
	@echo "make bench      - run the benchmarks (see BENCHMARKS.md)"
	@echo "make wheel      - dist/: the sdist and a self-contained manylinux wheel built from it"
	@echo "make check-wheel - install the wheel in a fresh venv and run it with the system libraries hidden"
	@echo "make gpu-bundle  - build/gpu-bundle: wheels, headers, libraries for the GPU check (docs/gpu-check.md)"
	@echo "make gpu-check   - on a CUDA machine with the bundle: build, gpu tests, bench_gpu.py into GPU_CHECK_OUT"
	@echo "make gpu-check-sim - the GPU check rehearsed here on the CPU, system libraries hidden"

setup:
	@if [ ! -x .venv/bin/python ] || [ ! -f $(SETUP_STAMP) ] || \
	    [ -n "$$(find $(SETUP_INPUTS) -newer $(SETUP_STAMP) 2>/dev/null)" ]; then \
	  $(MAKE) --no-print-directory apt venv develop && mkdir -p $(BUILD) && touch $(SETUP_STAMP); \
	fi
	@$(MAKE) --no-print-directory build

apt:
	@bash tools/setup_apt.sh

venv:
	@bash tools/setup_venv.sh

# The environment, made when missing (targets below need it but do not re-check it).
$(PY):
	@bash tools/setup_venv.sh

# Configured again only when the flags differ from the last configure (ninja re-runs CMake
# itself when a CMakeLists.txt changes).
build: | $(PY)
	@flags="-DCMAKE_BUILD_TYPE=RelWithDebInfo -DPython_EXECUTABLE=$(PY) -DDDP_BUILD_TESTS=ON $(CMAKE_FLAGS)"; \
	if [ ! -f $(BUILD)/build.ninja ] || [ "$$(cat $(BUILD)/.configure-flags 2>/dev/null)" != "$$flags" ]; then \
	  $(WITH_CCACHE) $(CMAKE) -S . -B $(BUILD) -G Ninja $$flags >/dev/null && \
	  echo "$$flags" > $(BUILD)/.configure-flags; \
	fi
	@$(WITH_CCACHE) $(CMAKE) --build $(BUILD) -j $(JOBS)

# Make this checkout the package the environment imports (a .pth to src/) and install the
# `dask-ddp` command, as `pip install -e .` would; the last checkout set up wins.
develop: venv
	@site=$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'); \
	  echo "$(ROOT)/src" > "$$site/dask_ddp_dev.pth"
	@printf '#!%s\nimport sys\nfrom dask_ddp.cli import main\nif __name__ == "__main__":\n    sys.exit(main())\n' \
	  "$$(readlink -f .venv)/bin/python" \
	  > .venv/bin/dask-ddp && chmod +x .venv/bin/dask-ddp

test: setup test-cpp test-py

test-quick: build
	cd $(BUILD) && $(ROOT)/.venv/bin/ctest --output-on-failure -j $(JOBS)
	$(PY) -m pytest -n $(PYTEST_WORKERS) $(PYTEST_DIST) -m "$(QUICK_MARKERS)" -q $(PYTEST_ARGS)

test-cpp:
	cd $(BUILD) && $(ROOT)/.venv/bin/ctest --output-on-failure -j $(JOBS)

# The tests run on one process per core (pytest-xdist), scheduled test by test (--dist
# worksteal: an idle process takes half of a busy one's queue). Each process keeps one Dask
# cluster that its tests lease and that heals after each (tests/cluster_lease.py); the
# order deals them out by expected time and groups them by cluster size
# (tests/scheduling.py). Every test isolates its ports, names and files (free ports, ids
# tagged by pid), so tests run side by side.
PYTEST_WORKERS ?= $(JOBS)
PYTEST_DIST := --dist worksteal
test-py:
	$(PY) -m pytest -n $(PYTEST_WORKERS) $(PYTEST_DIST) --durations=25 $(PYTEST_ARGS)

# The launch, results and chaos tests STRESS_RUNS times beside a CPU hog (one busy process
# per core), their modules side by side as CI runs them: timing faults show up as flakes
# here. Not in CI; prints the count of failures. Repetition lives here (DASK_DDP_STRESS=1,
# tests/stress.py): a fault test's every variant (victim rank 0 and 1, each on a fresh
# cluster; `make test` runs one), the chaos tests' STRESS_CHAOS_RUNS random faults each
# (DASK_DDP_CHAOS_RUNS; `make test` runs one smoke run beside the fault matrix,
# docs/testing.md),
# the live regroup test's STRESS_LIVE_TRIALS trials of two kills (DASK_DDP_LIVE_TRIALS; 4
# in `make test`).
STRESS_RUNS ?= 20
STRESS_CHAOS_RUNS ?= 12
STRESS_LIVE_TRIALS ?= 16
STRESS_TESTS ?= tests/launch/test_defects.py tests/launch/test_faults.py \
	tests/launch/test_stall.py tests/launch/test_stall_ddp.py tests/launch/test_waits.py \
	tests/launch/test_restarts.py tests/launch/test_command.py tests/results/test_results.py \
	tests/results/test_lifecycle.py tests/results/test_results_e2e.py \
	tests/launch/test_chaos.py tests/launch/test_chaos_live.py \
	tests/launch/test_live_audit.py tests/launch/test_live_regroup.py \
	tests/launch/test_fault_matrix.py
stress: build
	@mkdir -p $(BUILD)/stress; hogs=""; \
	for i in $$(seq $(JOBS)); do $(PY) -c 'while True: pass' & hogs="$$hogs $$!"; done; \
	trap 'kill $$hogs 2>/dev/null' EXIT; fails=0; \
	for i in $$(seq $(STRESS_RUNS)); do t0=$$(date +%s); \
	  if DASK_DDP_STRESS=1 DASK_DDP_CHAOS_RUNS=$(STRESS_CHAOS_RUNS) \
	    DASK_DDP_LIVE_TRIALS=$(STRESS_LIVE_TRIALS) \
	    $(PY) -m pytest -n $(PYTEST_WORKERS) \
	    $(PYTEST_DIST) -q -p no:cacheprovider \
	    $(STRESS_TESTS) > $(BUILD)/stress/run-$$i.log 2>&1; \
	  then echo "stress run $$i/$(STRESS_RUNS): ok in $$(( $$(date +%s) - t0 )) s, load $$(cut -d' ' -f1-3 /proc/loadavg)"; \
	  else fails=$$((fails + 1)); echo "stress run $$i/$(STRESS_RUNS): FAILED ($(BUILD)/stress/run-$$i.log)"; \
	    grep -E '^(FAILED|ERROR)|chaos seed' $(BUILD)/stress/run-$$i.log || true; fi; \
	done; echo "stress: $$fails of $(STRESS_RUNS) runs failed"; test $$fails -eq 0

asan: apt venv
	@$(WITH_CCACHE) $(CMAKE) -S . -B $(ASAN_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Debug \
	  -DDDP_SANITIZE=ON -DDDP_WERROR=ON -DDDP_BUILD_PYTHON=OFF -DDDP_BUILD_TESTS=ON >/dev/null
	@$(WITH_CCACHE) $(CMAKE) --build $(ASAN_BUILD) -j $(JOBS)
	cd $(ASAN_BUILD) && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
	  $(ROOT)/.venv/bin/ctest --output-on-failure -j $(JOBS)

# The libFuzzer targets' smoke run (clang, its own build directory, the compiler cache above).
FUZZ_SECONDS ?= 60
fuzz: | $(PY)
	@$(WITH_CCACHE) bash tools/fuzz_smoke.sh $(FUZZ_SECONDS)

lint: | $(PY)
	$(ROOT)/.venv/bin/ruff check src tests benchmarks examples
	$(ROOT)/.venv/bin/mypy
	$(ROOT)/.venv/bin/lint-imports --no-cache
	$(PY) tools/check_import_cycles.py

# The type stub of the C++ module, checked in (tests/test_stubs.py fails when it is stale).
stubs: build
	$(PY) -m nanobind.stubgen -q -m dask_ddp._core -o src/dask_ddp/_core.pyi

# The documentation site (docs/: Sphinx, MyST pages, the API pages from the docstrings).
# Warnings are errors, all reported (-W --keep-going); every reference to dask_ddp's API
# must resolve (-n); tests/docs/ checks that the built pages' relative links resolve.
DOCS_OUT ?= build/docs/html
docs: setup
	$(PY) -m sphinx -b html -n -W --keep-going -q docs $(DOCS_OUT)
	@echo "docs: $(DOCS_OUT)/index.html"

demo: setup
	$(PY) examples/transfer_learning.py $(DEMO_ARGS)

bench: setup
	@echo "See BENCHMARKS.md for each benchmark's command."

# The peers the benchmarks compare against (optional; each benchmark skips a missing one).
bench-deps: venv
	$(PY) -c 'import subprocess, sys, tempfile, tomllib; \
	  from importlib.metadata import version; \
	  peers = tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["bench"]; \
	  pins = tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False); \
	  pins.write("".join(f"{p}=={version(p)}\n" for p in ("torch", "torchvision"))); pins.close(); \
	  subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "-c", pins.name, *peers], check=True)'

# The sdist, then a wheel built from it and made self-contained (auditwheel + patchelf):
# see tools/build_wheel.sh and docs/user-guide/installation.md.
sdist: venv
	@bash tools/build_wheel.sh sdist

wheel: venv
	@$(WITH_CCACHE) bash tools/build_wheel.sh

check-wheel: wheel
	@bash tools/check_wheel.sh

# The GPU check (docs/gpu-check.md): the bundle is made here (it needs the project
# environment and the apt packages); the check runs on the GPU machine, from the checkout
# and the bundle, with nothing of this Makefile's environment (no .venv there).
GPU_CHECK_OUT ?= build/gpu-check
gpu-bundle: | $(PY)
	@bash tools/gpu/bundle.sh

gpu-check:
	@bash tools/gpu/check.sh $(GPU_CHECK_OUT)

gpu-check-sim: | $(PY)
	@bash tools/gpu/simulate.sh

clean:
	rm -rf build dist src/dask_ddp/_core*.so
