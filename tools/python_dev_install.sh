#!/usr/bin/env bash
# The Python package for `make test`: the test build's native module (built by `cargo test
# --workspace`, so no second build of the workspace), DuckDB's library and the worker program
# the llvm engine runs in beside the sources
# in python/xpu, and python/ on the venv's path. Users install the wheel (`make wheel`).
set -euo pipefail
target="${CARGO_TARGET_DIR:?}"
venv="${1:-.venv}"
cp -f "$target/debug/lib_xpu.so" python/xpu/_xpu.abi3.so
ln -sf "${DUCKDB_LIB_DIR:?}/libduckdb.so" python/xpu/libduckdb.so
ln -sf "$target/debug/xpu-worker" python/xpu/xpu-worker
site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
echo "$(pwd)/python" > "$site/xpu-dev.pth"
