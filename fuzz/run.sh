#!/usr/bin/env bash
# Builds the fuzz targets (cargo fuzz, coverage-instrumented, stable toolchain: no
# sanitizer) and runs each for SECONDS on its corpus: the seeds from the repository's
# examples and tests, what earlier runs found (kept in the target dir), and the committed
# regression cases (fuzz/regressions/TARGET, run first). Exits non-zero if any target
# crashes, panics, leaks past the memory limit or hangs past the per-input timeout; the input
# is saved under $CARGO_TARGET_DIR/fuzz/artifacts/TARGET/ (docs/fuzzing.md says what then).
#
#   fuzz/run.sh SECONDS [TARGET ...]     (every target when none is named)
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:?usage: fuzz/run.sh SECONDS [TARGET ...]}
shift
: "${CARGO_TARGET_DIR:=$HOME/.cache/xpu-target}"
work=$CARGO_TARGET_DIR/fuzz
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  mapfile -t targets < <(cd fuzz/fuzz_targets && ls ./*.rs | sed 's#^\./##; s#\.rs$##')
fi

cargo fuzz build --fuzz-dir fuzz -s none --target-dir "$work" >/dev/null
bin=$work/x86_64-unknown-linux-gnu/release

# Seeds: copied (never moved) into each corpus; libFuzzer keeps what it adds there.
seed() {
  local target=$1; shift
  mkdir -p "$work/corpus/$target"
  for f in "$@"; do
    [ -f "$f" ] && cp -n "$f" "$work/corpus/$target/$(echo "$f" | tr '/' '_')"
  done
  return 0
}
shopt -s nullglob
seed minilang examples/*.ml tests/minilang/*.ml
seed sgr_text examples/*.sgr tests/programs/*.sgr tests/filetests/*.sgr fuzz/seeds/sgr_text/*
seed lir_text tests/filetests/lir/*
seed onnx_model examples/*.onnx $(ls .cache/onnx-node/*/model.onnx 2>/dev/null | head -200)
# Low-precision types (packed 4- and 2-bit data, float8 casts), Unique and Col2Im.
seed onnx_model $(ls .cache/onnx-node/test_{cast,castlike,bitcast,quantizelinear,dequantizelinear,unique,col2im}*/model.onnx 2>/dev/null)
# Control flow: If, Loop and Scan with subgraphs (captures, nesting, carried values).
seed onnx_model $(ls .cache/onnx-node/test_{if,loop,scan,range,affine_grid}*/model.onnx 2>/dev/null)
seed npy examples/*.npy
seed tensor_pb $(ls .cache/onnx-node/*/0/*.pb 2>/dev/null | head -200)
seed tensor_pb $(ls .cache/onnx-node/test_{cast,dequantizelinear}*/0/*.pb 2>/dev/null)
seed csv_table examples/*.csv tests/minilang/*.csv
seed policy policies/examples/*.toml policies/builtin/*.toml
seed inventory policies/inventories/*.toml
seed lock_file fuzz/seeds/lock_file/*.toml
seed sgr_json fuzz/seeds/sgr_json/*
seed frozen_plan fuzz/seeds/frozen_plan/*
seed journal fuzz/seeds/journal/*
seed rest_body fuzz/seeds/rest_body/*

failed=()
for t in "${targets[@]}"; do
  mkdir -p "$work/artifacts/$t" "fuzz/regressions/$t"
  log=$work/artifacts/$t.log
  # -timeout: one input taking longer is a hang; -rss_limit_mb: a blow-up is a crash.
  if "$bin/$t" "$work/corpus/$t" "fuzz/regressions/$t" \
      -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
      -artifact_prefix="$work/artifacts/$t/" -print_final_stats=1 >"$log" 2>&1; then
    runs=$(grep -m1 -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo "?")
    echo "fuzz $t: ok, $runs inputs in ${seconds}s"
  else
    echo "fuzz $t: FAILED (log: $log)"
    grep -E 'panicked|ERROR|SUMMARY|Test unit written' "$log" | head -8 | sed 's/^/  /'
    failed+=("$t")
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: ${#failed[@]} target(s) failed: ${failed[*]}"
  exit 1
fi
