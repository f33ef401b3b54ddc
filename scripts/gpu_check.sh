#!/usr/bin/env bash
# The checks that need a CUDA GPU, in one run of under 8 minutes on one GPU, ending in one summary.
#
#   bash scripts/gpu_check.sh            # run them (from the repository root, the project importable)
#   bash scripts/gpu_check.sh --dry-run  # say what would run, run nothing
#
# 1. the cuda tests (pytest -m cuda): bf16/fp16 training with the scaler, amp auto, an update with
#    torch.cuda.set_sync_debug_mode("error") (no synchronisation), the additive padding mask,
#    half-precision decoding against fp32, the CUDA RNG state of checkpoints;
# 2. synthetic sentences for a vocabulary of 32,000 pieces (scripts/make_synthetic.py --lexicon:
#    no hub needed);
# 3. the steady-state training benchmark of configs/wmt14_base.yaml (Transformer-base, bf16) on
#    them: as configured with torch.compile off, then 6,250 tokens x 4 accumulated (the earlier
#    batches), each attention kernel alone (cudnn, efficient, math), and torch.compile on.
#    Each prints target tokens/s, MFU against the measured bf16 matmul peak, host/device time
#    per update, synchronisations per update, the attention kernel and the peak memory;
# 4. `translate train` of the same config on the same data: 200 updates, then --resume to 300,
#    its tokens/s (train.log) to set beside the benchmark's.
# Each step has a time cap (120 + 60 + 240 + 180 s), so that the whole run stays under 10 minutes.
# The summary lands in $GPU_CHECK_OUT/summary.txt (default gpu_check/), each step's whole log
# beside it; the synthetic data and the scratch runs in $GPU_CHECK_WORK (default /tmp/gpu_check).
set -uo pipefail
PY=${PYTHON:-python3}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # the package from this checkout, installed or not
export PYTHONUNBUFFERED=1
OUT=${GPU_CHECK_OUT:-gpu_check}
WORK=${GPU_CHECK_WORK:-/tmp/gpu_check}

tests() {
    timeout 120 $PY -m pytest -m cuda -q -rs --tb=short -p no:cacheprovider tests/test_cuda.py
}
synthetic() {
    timeout 60 $PY scripts/make_synthetic.py 300000 "$WORK/syn/train" --lexicon 60000  # 10 s on one CPU core
}
DATA=(--set data.source=files --set data.train="$WORK/syn/train" --set data.dataset=null --set data.subset=null)
benchmark() {
    timeout 240 $PY scripts/bench_train.py --config configs/wmt14_base.yaml --run-dir "$WORK/runs" --updates 24 \
        "${DATA[@]}" --set train.compile=false \
        --variant "6250 x 4=train.max_tokens=6250,train.accumulate=4" \
        --variant "attention cudnn=train.attention=cudnn" \
        --variant "attention efficient=train.attention=efficient" \
        --variant "compile=train.compile=true"
}
train() {
    # the benchmark's run directory: its data prepared once (--resume: no checkpoint there yet)
    local run=(--config configs/wmt14_base.yaml "${DATA[@]}" --set run_dir="$WORK/runs" --set name=wmt14_base_bench
        --set train.log_every=50 --set train.eval_every=100000 --set train.save_every=100
        --set train.eval_max_sentences=100 --resume)
    timeout 120 $PY -m translate train "${run[@]}" --set train.max_steps=200 &&
        timeout 60 $PY -m translate train "${run[@]}" --set train.max_steps=300
    local code=$?
    grep -h "tokens/s\|resumed\|training stopped" "$WORK/runs/wmt14_base_bench/train.log" | tail -n 8
    return $code
}
steps=(tests synthetic benchmark train)
if [ "${1:-}" = "--dry-run" ]; then
    echo "would run, in order (summary in $OUT/summary.txt):"
    for step in "${steps[@]}"; do declare -f "$step" | sed -n '3,$p' | sed '$d'; done
    exit 0
fi
mkdir -p "$OUT" "$WORK"
: >"$OUT/summary.txt"
{
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -1
    $PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)" 2>&1
} | tee -a "$OUT/summary.txt"
status=0
for step in "${steps[@]}"; do
    echo "== $step" | tee -a "$OUT/summary.txt"
    start=$(date +%s)
    $step >"$OUT/$step.log" 2>&1
    code=$?
    [ $code -eq 0 ] || status=1
    # the step's closing lines: test counts, or the benchmark's table
    grep -v "Warning\|warn(" "$OUT/$step.log" | tail -n 14 | tee -a "$OUT/summary.txt"
    echo "-- exit $code, $(($(date +%s) - start)) s" | tee -a "$OUT/summary.txt"
done
exit $status
