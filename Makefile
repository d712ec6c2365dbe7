# xpu — build, test, run and benchmark. Everything a fresh machine needs comes from here.
#
#   make run     xpud on embedded defaults (dev mode, ./var, port 8080); prints how to submit
#   make example the seed's example job locally: examples/example.ml on titanic.csv
#   make build   the optimised (release) binaries users run: `make run`, `make example`,
#                `make install`, `make bench` and `make soak` all use this one build
#   make install xpuctl, xpud, xpu-worker (release) and their libraries into PREFIX
#   make test    setup, format and lint checks, every test (conformance included)
#   make bench   xpu side by side with numpy and onnxruntime
#   make setup   Debian packages, the Python venv with the test oracles, exported test cases
#                (ONNX's node suite, and old-opset models with onnxruntime's outputs),
#                the ort/openvino engines' runtime libraries (.deps/), and llama.cpp's
#                server for `xpuctl ask`'s tests (built once into ~/.cache/xpu-llama)
#   make gpu-check-binary / gpu-check   the cuda engine's check on a GPU machine (build here,
#                run there: docs/engines.md)
#   make prune   drop stale build output from the persistent target dir (.ci/run past 30 GB)
#   make bless   re-bless golden files (filetests, generated docs, conformance expectations)
#   make soak    a bounded soak of a release xpud on loopback: mixed jobs, cancels, SIGHUPs,
#                worker kills (SOAK_MINUTES, default 5; docs/soak.md); `make test` runs 30 s
#                of it on the test build
#   make wheel   the Python package `xpu` as an abi3 wheel in dist/ (release build; docs/python.md)
#   make ask-eval ENDPOINT=URL MODEL=NAME   `xpuctl ask`'s evaluation set (tests/ask) against
#                a model you serve: execution accuracy with feedback off and on (docs/ask.md)
#   make fuzz    every parser's fuzz target for FUZZ_SECONDS each (default 300; docs/fuzzing.md);
#                `make test` runs each for FUZZ_CI_SECONDS (15) so a parser regression fails CI

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c

# A persistent target dir outside the clone keeps warm builds fast (CI reuses it).
export CARGO_TARGET_DIR ?= $(HOME)/.cache/xpu-target
# DuckDB is linked against its own prebuilt libduckdb.so (tools/fetch_duckdb.py puts it here);
# binaries find it through their $ORIGIN-relative rpath (.cargo/config.toml).
export DUCKDB_LIB_DIR ?= $(CARGO_TARGET_DIR)/duckdb
export CARGO_TERM_COLOR ?= never
# llama.cpp's server and grammar validator for `xpuctl ask`'s tests, built once per machine
# (tools/fetch_llama.py); the tests find them here.
export XPU_LLAMA_DIR ?= $(HOME)/.cache/xpu-llama

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
NODE_CASES := .cache/onnx-node
# Debian packages the build and tests need: OpenBLAS for the cpu.blas kernel, DejaVu Sans
# for the text of plots, Prometheus for `promtool` (metrics exposition and alert rules),
# LLVM 19 for the llvm engine's JIT (inkwell links it; clang-19 is not needed), and the
# riscv64 cross toolchain plus qemu-user for `llvm.riscv` and `xpuctl build --target riscv64`;
# g++ builds the cuda engine's generated kernels for the host (its GPU-free emulation).
# cmake builds llama.cpp's server for `xpuctl ask`'s tests (tools/fetch_llama.py).
APT_PACKAGES := libopenblas-dev fonts-dejavu-core prometheus llvm-19-dev libpolly-19-dev \
  libzstd-dev gcc-riscv64-linux-gnu libc6-dev-riscv64-cross qemu-user g++ cmake clang-19

.PHONY: ask-eval wheel python-test release run-deps soak gpu-check gpu-check-binary setup setup-llama setup-apt setup-duckdb setup-python setup-cases setup-engines setup-fuzz test target-owner lint build run install example bench bless fuzz clean-cache prune

setup: setup-apt setup-duckdb setup-python setup-cases setup-engines setup-fuzz setup-llama

setup-apt:
	@missing=""; for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] && echo "" || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing >/dev/null; \
	fi

# DuckDB's prebuilt shared library (pinned npm package, sha512-checked) into the target dir.
setup-duckdb:
	$(PYTHON) tools/fetch_duckdb.py $(DUCKDB_LIB_DIR)

setup-python: $(VENV)/.installed

$(VENV)/.installed: requirements.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -r requirements.txt
	touch $@

setup-cases: setup-python
	$(PY) tests/conformance/export_cases.py $(NODE_CASES)
	$(PY) tests/conformance/legacy_opsets.py .cache/legacy-opsets

# The engines' runtime libraries from their wheels into .deps/ (git-ignored): ONNX Runtime,
# OpenVINO, and the OpenBLAS numpy ships (scipy-openblas32) for `cpu.blas`; the engines find
# them there, or where configuration points. Only pip is needed, not the test venv.
setup-engines:
	$(PYTHON) engines/fetch_libraries.py .deps

setup-llama: setup-apt
	$(PYTHON) tools/fetch_llama.py $(XPU_LLAMA_DIR)

# cargo fuzz (from crates.io; it runs on the stable toolchain without a sanitizer).
CARGO_FUZZ_VERSION := 0.13.2
setup-fuzz:
	@cargo fuzz --version 2>/dev/null | grep -q " $(CARGO_FUZZ_VERSION)$$" || \
	  cargo install -q --locked cargo-fuzz --version $(CARGO_FUZZ_VERSION)

lint:
	cargo fmt --all --check
	cd fuzz && cargo fmt --check && cargo clippy -q --locked --bins -- -D warnings
	cargo clippy --workspace --all-targets --locked -- -D warnings

# The test build: every test command selects the whole workspace with all targets, so
# features resolve the same way each time. Its xpuctl/xpud serve `make test`'s own checks
# (policy check/test, the CI soak); users get the release build below.
XPUCTL := $(CARGO_TARGET_DIR)/debug/xpuctl

FUZZ_SECONDS ?= 300
FUZZ_CI_SECONDS ?= 15

test: setup lint target-owner
	cargo test --workspace --all-targets --locked --no-fail-fast
	$(XPUCTL) policy check policies/examples
	$(XPUCTL) policy test policies/examples
	$(MAKE) --no-print-directory python-test
	$(PY) tools/ask_eval.py --xpuctl $(XPUCTL) --self-check
	fuzz/run.sh $(FUZZ_CI_SECONDS)
	mkdir -p .cache
	$(PY) tools/soak/soak.py --minutes 0.5 --warmup 10 --kill-every 10 --hup-every 5 \
	  --xpud $(XPUD) --out .cache/soak-ci --no-rss-bar > .cache/soak-ci.log 2>&1 || \
	  { tail -60 .cache/soak-ci.log; exit 1; }
	@grep -m1 "^- requests" .cache/soak-ci.log

# The Python package's tests (pytest) on the test profile's native module: built beside
# `cargo test`'s libraries (same profile and features: only the module and a few crates
# compile), put beside the package's sources with python/ on the venv's path together with
# the test build's xpu-worker, which the llvm engine runs in (tools/python_dev_install.sh);
# the client's tests start the test build's xpud.
python-test: setup-python
	cargo build -q --workspace --lib --bins --locked --profile test
	tools/python_dev_install.sh $(VENV)
	cd python && ../$(PY) -m mypy xpu tests
	$(PY) -m pytest -q -p no:cacheprovider python/tests

# The wheel users install: release build by maturin, DuckDB's library and the worker program
# the llvm engine runs in (release, stripped) carried in the package.
wheel: setup-python setup-duckdb
	rm -f python/xpu/_xpu*.so python/xpu/libduckdb.so python/xpu/xpu-worker
	cargo build -q --release -p xpud --bin xpu-worker --locked
	install -m 644 $(DUCKDB_LIB_DIR)/libduckdb.so python/xpu/libduckdb.so
	install -m 755 -s $(CARGO_TARGET_DIR)/release/xpu-worker python/xpu/xpu-worker
	$(PY) -m maturin build --release --strip --locked -m python/Cargo.toml -o dist
	rm -f python/xpu/libduckdb.so python/xpu/xpu-worker
	@ls -l dist/*.whl

# Test binaries bake their checkout's path in (`env!("CARGO_MANIFEST_DIR")` finds test data)
# and cargo's fingerprints leave it out: a target dir last used by a checkout elsewhere can
# hold binaries that look fresh but read that other checkout's files (or none, once it is
# gone). When the checkout using the target dir changes, its executables are rebuilt.
target-owner:
	@owner="$(CARGO_TARGET_DIR)/.xpu-checkout"; mkdir -p "$(CARGO_TARGET_DIR)"; \
	if [ -f "$$owner" ] && [ "$$(cat "$$owner")" != "$(CURDIR)" ]; then \
	  echo "$(CARGO_TARGET_DIR) was last used by $$(cat "$$owner"): its test executables are rebuilt"; \
	  find "$(CARGO_TARGET_DIR)/debug/deps" -maxdepth 1 -type f -perm -u+x -delete 2>/dev/null || true; \
	fi; \
	echo "$(CURDIR)" > "$$owner"

# A bounded soak (docs/soak.md) of the release xpud: SOAK_MINUTES (default 5); the report goes
# to .cache/soak/report.md.
SOAK_MINUTES ?= 5
soak: setup release
	$(PY) tools/soak/soak.py --minutes $(SOAK_MINUTES)

# Every fuzz target (or FUZZ_TARGETS="npy policy") for FUZZ_SECONDS each.
fuzz: setup-fuzz
	fuzz/run.sh $(FUZZ_SECONDS) $(FUZZ_TARGETS)

XPUD := $(CARGO_TARGET_DIR)/debug/xpud

# The binaries users run: the release profile (optimised, line tables for backtraces), every
# binary of the workspace (and the Python package's native module, which `make bench`
# measures) in one build that `make run`, `make example`, `make install`, `make bench` and
# `make soak` share.
RELEASE := $(CARGO_TARGET_DIR)/release
release: setup-duckdb
	cargo build -q --release --locked --workspace --bins --lib

build: release

# The cpu engine's OpenBLAS and the other engines' libraries come from `make setup`.
run-deps: setup-apt setup-engines

# The daemon on embedded defaults: --dev (no auth, loopback only), ./var, the example
# policies, port 8080. It prints how to submit the seed's example job; Ctrl-C drains and stops.
run: run-deps release
	$(RELEASE)/xpud --dev --listen 127.0.0.1:8080 --data-dir var

# xpuctl, xpud and xpu-worker (the engines' worker processes) from the release build into
# $(PREFIX)/bin; DuckDB's library and the cpu engine's OpenBLAS into $(PREFIX)/lib/xpu
# (where their rpath and the engine look); then `xpuctl` works from any directory when
# $(PREFIX)/bin is on the PATH.
PREFIX ?= $(HOME)/.local
install: run-deps release
	install -d $(PREFIX)/bin $(PREFIX)/lib/xpu
	install -m 755 $(RELEASE)/xpuctl $(RELEASE)/xpud $(RELEASE)/xpu-worker $(PREFIX)/bin/
	install -m 644 $(DUCKDB_LIB_DIR)/libduckdb.so .deps/openblas/libscipy_openblas.so $(PREFIX)/lib/xpu/
	@echo "installed xpuctl, xpud and xpu-worker (release build) in $(PREFIX)/bin"

# The seed's example job, run locally without the daemon.
example: run-deps release
	cd examples && $(RELEASE)/xpuctl run example.ml --out ../out/example

ask-eval: setup-python release
	@test -n "$(ENDPOINT)" -a -n "$(MODEL)" || { echo "usage: make ask-eval ENDPOINT=http://HOST:PORT/v1 MODEL=NAME"; exit 2; }
	mkdir -p .cache
	$(PY) tools/ask_eval.py --xpuctl $(CARGO_TARGET_DIR)/release/xpuctl --endpoint "$(ENDPOINT)" \
	  --model "$(MODEL)" --out .cache/ask-eval.json

bench: setup release
	$(PY) bench/run.py

bless: setup
	XPU_BLESS=1 cargo test --workspace --all-targets --locked

# The cuda engine on a GPU machine (docs/engines.md, "Checking on a GPU"). Here: build the
# slim release binary (no LLVM, DuckDB or ONNX Runtime) into .gpu-check/. There (CUDA and
# PyTorch, no Rust): `make gpu-check` runs it beside PyTorch and writes the report.
gpu-check-binary:
	cargo build -q --release --locked -p xpu-gpu-check
	mkdir -p .gpu-check
	strip -o .gpu-check/xpu-gpu-check $(CARGO_TARGET_DIR)/release/xpu-gpu-check
	@ls -l .gpu-check/xpu-gpu-check

gpu-check:
	bash tools/gpu-check/run.sh

clean-cache:
	rm -rf .cache

# Stale build output in the persistent target dir: incremental caches and builds of workspace
# crates superseded by newer ones (tools/prune_target.py); .ci/run calls it past 30 GB.
prune:
	python3 tools/prune_target.py $(CARGO_TARGET_DIR)
