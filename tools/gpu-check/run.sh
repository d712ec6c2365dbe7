#!/usr/bin/env bash
# `make gpu-check` on a GPU machine (CUDA driver, PyTorch with its CUDA wheels, no Rust):
# runs the slim release binary `make gpu-check-binary` made on a build machine
# (.gpu-check/xpu-gpu-check, carried in), then PyTorch's side, and writes the report to
# $OUT (or out/gpu-check). NVRTC is found in PyTorch's nvidia wheels unless
# XPU_CUDA_LIBRARY_DIR says where. Exit: the binary's (0 all programs matched, 1 a mismatch,
# 3 no usable GPU).
set -uo pipefail
cd "$(dirname "$0")/../.."
BIN=${XPU_GPU_CHECK_BIN:-.gpu-check/xpu-gpu-check}
DIR=${OUT:-out/gpu-check}
PY=${PYTHON:-python3}
mkdir -p "$DIR"
if [ ! -x "$BIN" ]; then
  echo "gpu-check: $BIN is missing: run 'make gpu-check-binary' on a build machine first" >&2
  exit 2
fi
if [ -z "${XPU_CUDA_LIBRARY_DIR:-}" ]; then
  XPU_CUDA_LIBRARY_DIR=$("$PY" - <<'PYEOF'
import glob, os
try:
    import nvidia
    roots = list(nvidia.__path__)
except ImportError:
    roots = []
hits = sorted(h for r in roots for h in glob.glob(os.path.join(r, "**", "libnvrtc.so*"), recursive=True))
print(os.path.dirname(hits[-1]) if hits else "")
PYEOF
)
  export XPU_CUDA_LIBRARY_DIR
fi
echo "gpu-check: NVRTC from ${XPU_CUDA_LIBRARY_DIR:-the loader path}"
"$BIN" tests/programs > "$DIR/xpu.json"
code=$?
if [ "$code" = 2 ]; then
  echo "gpu-check: the binary failed" >&2
  exit 2
fi
"$PY" tools/gpu-check/torch_side.py bench "$DIR/torch.json" || echo '{"torch": "unavailable", "device": "", "programs": {}, "gemm_bf16": {}}' > "$DIR/torch.json"
"$PY" tools/gpu-check/torch_side.py report "$DIR/xpu.json" "$DIR/torch.json" "$DIR/gpu-check-report.md"
exit "$code"
