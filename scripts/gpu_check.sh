#!/usr/bin/env bash
# The checks that need a CUDA GPU, in one run of under 8 minutes on one GPU, ending in one summary.
#
#   bash scripts/gpu_check.sh            # run them (from the repository root, the project importable)
#   bash scripts/gpu_check.sh --dry-run  # say what would run, run nothing
#
# 0. preflight: CUDA usable and every package the steps import (else one line and stop);
# 1. the cuda tests (pytest -m cuda), in the background beside steps 2 and 3 (they need little of
#    the GPU and its host, and no prepared data), joined before the benchmark so that nothing runs
#    beside it: bf16/fp16 training with the scaler, amp auto, an update with
#    torch.cuda.set_sync_debug_mode("error") (no synchronisation), the additive padding mask,
#    half-precision decoding against fp32, the CUDA RNG state of checkpoints, updates under each
#    train.attention kernel;
# 2. synthetic sentences for a vocabulary of 32,000 pieces (scripts/make_synthetic.py --lexicon:
#    no hub needed);
# 3. `translate prepare` of configs/wmt14_base.yaml on them (the SentencePiece model, the encoded data);
# 4. the steady-state training benchmark of that config (Transformer-base, bf16) on them: as
#    configured (eager), then 6,250 tokens x 4 accumulated (the earlier batches), and each attention
#    kernel that takes a padding mask alone (cudnn, efficient; the one `auto` ran alone is not timed
#    again), then flash (with efficient for the masked calls). Each prints target tokens/s, MFU
#    against the measured bf16 matmul peak, host/device time per update, synchronisations per
#    update, the attention kernel and the peak memory;
# 5. `translate train` of the same config on the same data: 200 updates, then --resume to 300,
#    its tokens/s (train.log) to set beside the benchmark's;
# 6. the benchmark with torch.compile on (last: its graphs take longest to build).
# The steps run in that order, the most wanted figures first, under one deadline
# ($GPU_CHECK_BUDGET seconds, default 480): each step's time cap is its own or what is left,
# whichever is less, and a step with under 20 s left is skipped: give the whole script a minute
# more than the budget wherever its time is limited.
# The summary lands in $GPU_CHECK_OUT/summary.txt (default gpu_check/): the GPU, torch, the config, each
# step's last lines and exit (a step stopped at its time cap says so), then the steps that failed; each
# step's whole log beside it; the synthetic data and the scratch runs in $GPU_CHECK_WORK (default /tmp/gpu_check;
# its runs are removed first, so that a second run measures afresh).
# To try the script's flow on a CPU (every figure meaningless, the cuda tests skipped, so failed):
#   GPU_CHECK_CPU=1 GPU_CHECK_CONFIG=configs/tiny.yaml GPU_CHECK_SENTENCES=20000 bash scripts/gpu_check.sh
set -uo pipefail
PY=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}  # the project's venv where there is one
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # the package from this checkout, installed or not
export PYTHONUNBUFFERED=1
SUMMARY_DIR=${GPU_CHECK_OUT:-gpu_check}
WORK=${GPU_CHECK_WORK:-/tmp/gpu_check}
DEADLINE=$(($(date +%s) + ${GPU_CHECK_BUDGET:-480}))

capped() {  # capped SECONDS COMMAND...: the command under the lesser of SECONDS and the time left
    local left=$((DEADLINE - $(date +%s) - 5))
    local cap=$(($1 < left ? $1 : left))
    shift
    if [ "$cap" -lt 20 ]; then
        echo "skipped: ${cap} s left of the budget"
        return 125
    fi
    timeout -k 10 "$cap" "$@"
}
preflight() {
    capped 60 $PY - <<'PY'
import os, sys
try:
    import torch
except ImportError:
    sys.exit(f"cannot import torch ({sys.executable}): install the project, or set PYTHON")
cpu = os.environ.get("GPU_CHECK_CPU") == "1"
if not cpu and not torch.cuda.is_available():
    sys.exit(f"no usable CUDA device (torch {torch.__version__}, CUDA {torch.version.cuda}, {sys.executable})")
try:
    for module in ("sentencepiece", "sacrebleu", "typer", "tqdm", "yaml", "numpy", "matplotlib", "tensorboard", "pytest"):
        __import__(module)
    import translate.cli, translate.train  # noqa: E401,F401  everything the steps import
except ImportError as e:
    sys.exit(f"cannot import {e.name} ({sys.executable}): install the project, or set PYTHON")
if not cpu:
    torch.ones(1, device="cuda").sum().item()
    print("CUDA", torch.version.cuda, "cuDNN", torch.backends.cudnn.version(), torch.cuda.get_device_name(0))
import shutil, sysconfig  # noqa: E401  torch.compile (the last step) builds C code with them
compiler = next((c for c in ("cc", "gcc", "clang") if shutil.which(c)), None)
headers = os.path.isfile(os.path.join(sysconfig.get_paths()["include"], "Python.h"))
if not (compiler and headers):
    print(f"note: the compile step will likely fail: C compiler {compiler or 'none'}, Python.h {'found' if headers else 'missing'}")
PY
}
DATA=(--set data.source=files --set data.train="$WORK/syn/train" --set data.dataset=null --set data.subset=null
    --set data.max_train_pairs=null)
CONFIG=(--config "${GPU_CHECK_CONFIG:-configs/wmt14_base.yaml}" "${DATA[@]}" --set name=wmt14_base)
BENCH_RUN=$WORK/runs/wmt14_base_bench   # bench_train.py's scratch run of the config (its name + _bench)
TRAIN_RUN=$WORK/runs/wmt14_base_train
synthetic() {
    capped 60 $PY scripts/make_synthetic.py "${GPU_CHECK_SENTENCES:-300000}" "$WORK/syn/train" --lexicon 60000  # 10-25 s
}
prepare() {  # once: the benchmark's run directory; the training gets a copy of its data
    capped 150 $PY -m translate prepare "${CONFIG[@]}" --set run_dir="$WORK/runs" --set name=wmt14_base_bench &&
        mkdir -p "$TRAIN_RUN" && cp -r "$BENCH_RUN/data" "$BENCH_RUN/spm.model" "$TRAIN_RUN/"
}
benchmark() {
    capped 200 $PY scripts/bench_train.py "${CONFIG[@]}" --run-dir "$WORK/runs" --steady-state --updates 24 --set train.compile=false \
        --variant "6250 x 4=train.max_tokens=6250,train.accumulate=4" \
        --variant "attention cudnn=train.attention=cudnn" \
        --variant "attention efficient=train.attention=efficient" \
        --variant "attention flash=train.attention=flash"
}
train() {
    local run=("${CONFIG[@]}" --set run_dir="$WORK/runs" --set name=wmt14_base_train --set train.log_every=50 --set train.eval_every=100000 --set train.save_every=100
        --set train.average_last=null --set train.eval_max_sentences=100 --resume)
    capped 120 $PY -m translate train "${run[@]}" --set train.max_steps=200 &&
        capped 90 $PY -m translate train "${run[@]}" --set train.max_steps=300
    local code=$?
    grep -h "tokens/s\|resumed\|training stopped" "$TRAIN_RUN/train.log" | tail -n 8
    return $code
}
tests() {
    capped 180 $PY -m pytest -o addopts= -m cuda -q -rs --tb=short -p no:cacheprovider tests/test_cuda.py
    local code=$?
    # every test skipped (no usable GPU) is no pass: pytest's last line says "N skipped in" without "passed"
    local last
    last=$(tail -n 1 "$SUMMARY_DIR/tests.log")
    if [ $code -eq 0 ] && [[ $last == *skipped* && $last != *passed* ]]; then
        code=1
    fi
    return $code
}
compile() {
    capped 180 $PY scripts/bench_train.py "${CONFIG[@]}" --run-dir "$WORK/runs" --steady-state --updates 24 --set train.compile=true
}
steps=(preflight tests synthetic prepare benchmark train compile)
background=tests  # started after the preflight, joined before the benchmark
if [ "${1:-}" = "--dry-run" ]; then
    echo "would run, in order, within ${GPU_CHECK_BUDGET:-480} s (summary in $SUMMARY_DIR/summary.txt; $background in the background from its turn to the benchmark's):"
    for step in "${steps[@]}"; do declare -f "$step" | sed -n '3,$p' | sed '$d'; done
    exit 0
fi
mkdir -p "$SUMMARY_DIR" "$WORK"
rm -rf "$WORK/runs" "$SUMMARY_DIR"/*.exit
: >"$SUMMARY_DIR/summary.txt"
{
    if command -v nvidia-smi >/dev/null; then
        nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -1
    else
        echo "no nvidia-smi on this machine"
    fi
    $PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)" 2>&1 | tail -n 1
    echo "config ${GPU_CHECK_CONFIG:-configs/wmt14_base.yaml}, ${GPU_CHECK_SENTENCES:-300000} synthetic sentences, budget ${GPU_CHECK_BUDGET:-480} s"
} | tee -a "$SUMMARY_DIR/summary.txt"
status=0
failed=()
report() {  # report STEP EXIT SECONDS: the step's closing lines and its exit, into the summary
    local step=$1 code=$2 why=""
    [ "$code" -eq 0 ] || { status=1; failed+=("$step"); }
    # the step's closing lines: test counts, or the benchmark's table (of a progress bar, its last state)
    sed 's/.*\r//' "$SUMMARY_DIR/$step.log" | grep -v "Warning\|warn(" | tail -n 14 | tee -a "$SUMMARY_DIR/summary.txt"
    case $code in
        124) why=" (stopped at its time cap)" ;;
        125) why=" (skipped: too little of the budget left)" ;;
        137) why=" (killed: its time cap's second signal, or memory)" ;;
    esac
    echo "-- exit $code$why, $3 s" | tee -a "$SUMMARY_DIR/summary.txt"
}
join_background() {  # wait for the background step, then report it
    [ -n "${background_pid:-}" ] || return 0
    wait "$background_pid"
    background_pid=
    echo "== $background (joined)" | tee -a "$SUMMARY_DIR/summary.txt"
    local code=1 seconds="?"
    read -r code seconds <"$SUMMARY_DIR/$background.exit" || echo "no exit recorded" >>"$SUMMARY_DIR/$background.log"
    report "$background" "$code" "$seconds"
}
for step in "${steps[@]}"; do
    if [ "$step" = "$background" ]; then
        echo "== $step: started in the background" | tee -a "$SUMMARY_DIR/summary.txt"
        (
            start=$(date +%s)
            $step >"$SUMMARY_DIR/$step.log" 2>&1
            echo "$? $(($(date +%s) - start))" >"$SUMMARY_DIR/$step.exit"
        ) &
        background_pid=$!
        continue
    fi
    [ "$step" = benchmark ] && join_background  # nothing beside the measurements
    echo "== $step" | tee -a "$SUMMARY_DIR/summary.txt"
    start=$(date +%s)
    $step >"$SUMMARY_DIR/$step.log" 2>&1
    code=$?
    report "$step" $code $(($(date +%s) - start))
    if [ "$step" = preflight ] && [ $code -ne 0 ]; then
        echo "stopped: the preflight failed, no other step ran" | tee -a "$SUMMARY_DIR/summary.txt"
        break
    fi
done
join_background
echo "== ${#failed[@]} of ${#steps[@]} steps failed${failed:+: ${failed[*]}}" | tee -a "$SUMMARY_DIR/summary.txt"
exit $status
