#!/usr/bin/env bash
# GPU check, <= 5 minutes on one CUDA device. Run from the repository root after
# `bash scripts/setup.sh test` with a CUDA build of torch:
#   bash bench/gpu_check.sh [OUT_DIR]
# 1. fused-vs-reference forward and forward+backward ratios, one-head and all-heads cache
#    ratios, and a bf16 training step (bench/gpu_check.py, JSON lines);
# 2. the tests marked `cuda` (skipped on a CPU-only machine, run here);
# 3. `headwise demo --device cuda` (train + verify + report; exit 0 = the contract holds);
# 4. sharded training (`train.parallel: fsdp`, nccl) on every GPU of the machine vs one process:
#    per-rank parameter + gradient + AdamW bytes and `torch.cuda.max_memory_allocated`
#    (bench/bench_fsdp.py, ~52M parameters; on a 1-GPU machine fsdp runs on one rank).
# Exit status: the first failing step's.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
OUT=${1:-/tmp/headwise_gpu_check}
mkdir -p "$OUT"
"$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'gpu_check: no CUDA device (torch %s)' % torch.__version__)"
echo "== ratios and bf16 step"
timeout 180 "$PY" -m bench.gpu_check | tee "$OUT/gpu_check.jsonl"
echo "== tests marked cuda"
timeout 90 "$PY" -m pytest -q -m cuda tests -p no:cacheprovider | tee "$OUT/pytest_cuda.txt"
echo "== headwise demo --device cuda"
HW=${HEADWISE:-.venv/bin/headwise}
time (timeout 120 "$HW" demo --device cuda --quiet --out "$OUT/demo" 2>&1 | tee "$OUT/demo.txt")
echo "== fsdp vs one process"
NGPU=$("$PY" -c "import torch; print(torch.cuda.device_count())")
timeout 240 "$PY" -m bench.bench_fsdp --device cuda --rounds 1 --steps 6 \
    --systems "none:1,fsdp:$NGPU" | tee "$OUT/fsdp.txt"
echo "gpu_check: all steps passed; outputs in $OUT"
