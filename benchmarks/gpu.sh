#!/usr/bin/env bash
# One GPU session's checks and benchmarks, in priority order, each under its own time limit and
# all under one deadline, so that a short lease still brings back the most important results:
#
#   bash benchmarks/gpu.sh OUT_DIR [SECONDS]      # SECONDS: the whole run's deadline (540)
#   STEPS="forward train-gpt2" bash benchmarks/gpu.sh OUT_DIR   # only these steps
#   TRAIN_EXTRA="--no-compile" ...               # added to every training-step benchmark
#
# Each step's log and every result file (benchmarks' JSON, Markdown, PNG) land in OUT_DIR, and
# $ARCHIVE (OUT_DIR/gpu-results.tgz) packs them all again after every step (a run cut short keeps
# what it finished). The interpreter is $PY (python3), with its own jax (CUDA), flax, optax,
# torch (CUDA) and transformers; the repository is put on PYTHONPATH, nothing is installed.
#
# Steps: the versions and the card; the GPU-marked tests (cuDNN flash attention, float32 parity
# against CUDA torch); the loop dispatching ahead (deterministic kernels); the bfloat16 model
# tests (cuDNN attention by default there); the main job (`jaxformer parity`) on the GPU; greedy
# decoding of GPT-2 small (batch 1 and 8, float32, against Hugging Face); the bfloat16 forward of
# BERT-base and GPT-2 small (the default attention, cuDNN's in bfloat16 on a GPU, then XLA's); the
# training step of GPT-2 small in bfloat16 at 16 x 1024 (jaxformer by default, with cuDNN's
# attention taking every mask as a bias, torch_ref eager, torch.compile: MFU; a profile of the
# jaxformer steps, summed by kernel); GPT-2's and BERT-base's steps with each update dispatched
# before the previous loss is read; jaxformer train's loop with and without dispatching ahead
# (bench_loop.py); BERT-base's training step in bfloat16 at 32 x 512 (the same, XLA's attention
# too, and its profile); GPT-2's step with XLA's Triton GEMMs on and off and with XLA's attention;
# the model parity files.
# The first lease (docs/performance.md, "On a GPU") found the training steps with torch.compile
# need more than 200 s each: give the run its whole deadline.
set -u
OUT=${1:?usage: bash benchmarks/gpu.sh OUT_DIR [SECONDS]}
DEADLINE=$((SECONDS + ${2:-540}))
PY=${PY:-python3}
cd "$(dirname "$0")/.."
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export XLA_PYTHON_CLIENT_PREALLOCATE=false  # JAX and torch share the card

step() {  # step NAME LIMIT COMMAND...: run with LIMIT seconds at most, or skip past the deadline
    local name=$1 limit=$2 left=$((DEADLINE - SECONDS)) t0=$SECONDS
    shift 2
    [[ -n ${STEPS:-} && " $STEPS " != *" $name "* ]] && return
    ((left < limit)) && limit=$left
    if ((limit < 30)); then echo "=== $name: skipped (deadline)"; return; fi
    echo "=== $name: up to ${limit}s, $(date -u +%T)"
    timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
    echo "=== $name: exit $? after $((SECONDS - t0))s"
    grep -E "^\| |passed|failed|skipped|Error" "$OUT/$name.log" | tail -n 14
    tar czf "$PACK" -C "$OUT" --exclude=gpu-results.tgz --exclude="*.xplane.pb" . && mv "$PACK" "$ARCHIVE"
}
ARCHIVE=${ARCHIVE:-$OUT/gpu-results.tgz}
PACK=${TMPDIR:-/tmp}/gpu-results.$$.tgz
BF16=(--device gpu --dtype bfloat16 --matmul-precision default --out "$OUT")
TRAIN=("${BF16[@]}" --repeats 8 --warmup 2 ${TRAIN_EXTRA:-})

nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm \
    --format=csv >"$OUT/card.txt" 2>&1
"$PY" -c "import sys, jax, flax, optax, torch; print(sys.version.split()[0], 'jax', jax.__version__,
'flax', flax.__version__, 'optax', optax.__version__, 'torch', torch.__version__, jax.devices(),
torch.cuda.is_available())" >>"$OUT/card.txt" 2>&1
cat "$OUT/card.txt"

step tests-gpu 120 "$PY" -m pytest -q -p no:cacheprovider parity_tests/test_gpu.py
# the bfloat16 model tests: "auto" attention is cuDNN's on a GPU since the fourth lease
step tests-bf16 90 "$PY" -m pytest -q -p no:cacheprovider parity_tests/models/test_bf16.py \
    parity_tests/models/test_autocast.py
# jaxformer train dispatches ahead on a GPU: the same run bit for bit (deterministic kernels)
step tests-ahead 90 env XLA_FLAGS=--xla_gpu_deterministic_ops=true "$PY" -m pytest -q \
    -p no:cacheprovider parity_tests/training/test_dispatch_ahead.py
step parity 60 "$PY" -m jaxformer.cli parity
step decode 90 "$PY" benchmarks/bench_decode.py --device gpu --matmul-precision default \
    --out "$OUT" --batches 1,8 --new 128 --repeats 5
step forward 60 "$PY" benchmarks/bench_forward.py "${BF16[@]}" --models bert,gpt2 --batch 32 \
    --seq 512 --repeats 10
step forward-xla 60 "$PY" benchmarks/bench_forward.py "${BF16[@]}" --models bert,gpt2 \
    --batch 32 --seq 512 --repeats 10 --attention-implementation xla --tag xla
# GPT-2 with XLA's attention (its 16 x 12 x 1024 x 1024 scores per layer) beside torch ran out of
# memory on an 80 GB H100 (fourth lease): XLA's attention is measured in train-gpt2-triton
step train-gpt2 250 "$PY" benchmarks/bench_train.py "${TRAIN[@]}" --models gpt2 --batch 16 \
    --seq 1024 --jax-variants cudnn-bias --profile "$OUT/profile"
step profile-gpt2 40 "$PY" benchmarks/profile_summary.py "$OUT/profile/gpt2/jaxformer" \
    --json "$OUT/profile-gpt2.json"
# the host's ~4 ms between steps (fourth lease's profile): each update dispatched before the
# previous one's loss is read, four updates a call, paired with the usual step
step train-gpt2-late 200 "$PY" benchmarks/bench_train.py "${TRAIN[@]}" --models gpt2 --batch 16 \
    --seq 1024 --jax-only --updates-per-call 4 --jax-variants late-fetch --tag late-fetch
step train-bert-late 200 "$PY" benchmarks/bench_train.py "${TRAIN[@]}" --models bert --batch 32 \
    --seq 512 --jax-only --updates-per-call 4 --jax-variants late-fetch --tag late-fetch
# the loop itself (batches, metrics lines): GPT-2 small, dropout on, with and without
step loop-gpt2 240 "$PY" benchmarks/bench_loop.py --preset gpt2 --dtype bfloat16 --batch 16 \
    --seq 1024 --steps 30 --rounds 2 --out "$OUT"
step train-bert 270 "$PY" benchmarks/bench_train.py "${TRAIN[@]}" --models bert --batch 32 \
    --seq 512 --jax-variants xla,cudnn-bias --profile "$OUT/profile"
step profile-bert 40 "$PY" benchmarks/profile_summary.py "$OUT/profile/bert/jaxformer" \
    --json "$OUT/profile-bert.json"
# XLA's GEMMs: its 8192^3 bfloat16 product ran at 87% of cuBLAS's rate through torch (first
# lease); jaxformer's step turns its Triton GEMMs off on a GPU (jaxformer.runtime), the
# triton-gemm variants turn them back on, in the same rounds
step train-gpt2-triton 230 "$PY" benchmarks/bench_train.py "${TRAIN[@]}" --models gpt2 \
    --batch 16 --seq 1024 --jax-only --jax-variants triton-gemm,xla,xla+triton-gemm \
    --tag triton-gemm
step tests-models 120 "$PY" -m pytest -q -p no:cacheprovider parity_tests/models parity_tests/nn
echo "=== done after ${SECONDS}s"
