#!/usr/bin/env bash
# The checks that need a CUDA GPU, in one run of a few minutes on one GPU, ending in one summary.
#
#   bash scripts/gpu_check.sh            # run them (from the repository root, the project importable)
#   bash scripts/gpu_check.sh --dry-run  # say what would run, run nothing
#
# 1. the cuda test suite (pytest -m cuda): bf16/fp16 training with the scaler, amp auto,
#    half-precision decoding against fp32, the CUDA RNG state of checkpoints;
# 2. training speed of configs/wmt14_base.yaml (Transformer-base) in bf16, with MFU against the
#    GPU's measured bf16 matmul peak, on synthetic sentences made from the committed fixture
#    (no hub needed; vocabulary 3,000 as the fixture is small; torch.compile off so that the
#    time goes to training, not to compiling each batch shape).
# The summary lands in $GPU_CHECK_OUT/summary.txt (default gpu_check/).
set -uo pipefail
PY=${PYTHON:-python3}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # the package from this checkout, installed or not
OUT=${GPU_CHECK_OUT:-gpu_check}
steps=(
    "$PY -m pytest -m cuda -q -rs --tb=line -p no:cacheprovider tests/test_cuda.py"
    "$PY scripts/make_synthetic.py 100000 $OUT/syn/train --from tests/fixtures/bible.train"
    "$PY scripts/bench_train.py --config configs/wmt14_base.yaml --precisions bf16 --run-dir $OUT/runs --windows 4 --set data.source=files --set data.train=$OUT/syn/train --set vocab.size=3000 --set train.compile=false"
)
if [ "${1:-}" = "--dry-run" ]; then
    echo "would run, in order (summary in $OUT/summary.txt):"
    printf '  %s\n' "${steps[@]}"
    exit 0
fi
mkdir -p "$OUT"
: >"$OUT/summary.txt"
status=0
for step in "${steps[@]}"; do
    echo "== $step" | tee -a "$OUT/summary.txt"
    start=$(date +%s)
    $step >"$OUT/step.log" 2>&1
    code=$?
    [ $code -eq 0 ] || status=1
    # the step's closing lines: test counts, or the benchmark's table
    tail -n 12 "$OUT/step.log" | tee -a "$OUT/summary.txt"
    echo "-- exit $code, $(($(date +%s) - start)) s" | tee -a "$OUT/summary.txt"
done
exit $status
