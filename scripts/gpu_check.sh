#!/usr/bin/env bash
# gpu_check.sh: the first checks to run on a machine with NVIDIA GPUs, in one command, one report.
#
# NOT RUN YET. Written on CPU-only machines (no GPU machine was available when it was written);
# expect the first run to need fixes. Put its report in docs/measure.md when it has run. Checked on
# CPU: step 5's command line passes Zeppelin's start-up check and stops at Megatron's "Megatron
# requires CUDA." assertion (core_v0.16.1 snapshot); the report, the time limits, the step selection
# and the log bundle (tests/measure/test_gpu_check_script.py).
#
#   MEGATRON_LM=/path/to/Megatron-LM bash scripts/gpu_check.sh [OUT_DIR]
#
# Steps (each one runs even when an earlier one failed; the report says which failed or ran out of time):
#   1.  environment: nvidia-smi, Python, torch/CUDA, megatron-core, flash-attn, Transformer Engine;
#   2.  the gpu-marked tests: python -m pytest -q -m gpu;
#   3.  zeppelin profile on GPU 0 (bf16) -> OUT/profile.json;
#   4a. one step of 1M tokens of arxiv-64k lengths (seed 0);
#   4b. zeppelin replay of its 32-rank (4x8 H100 cluster file) plan against that profile: measured
#       per-rank kernel time vs the cost model's prediction -> OUT/replay.json;
#   5.  10 iterations of Megatron-LM's pretrain_gpt.py with --zeppelin on one GPU (the launcher,
#       scripts/pretrain_gpt_zeppelin.py), a small GPT on a small indexed dataset written to scratch.
# Writes OUT/report.md (each step's status, time and the tail of its log), OUT/profile.json,
# OUT/replay.json and OUT/logs.tar.gz (every step's full log and the lengths): four files, whatever
# ran. Exit code: the number of steps that failed or ran out of time.
#
# Time: every step runs under a limit (its own, GPU_CHECK_STEP_LIMIT when set, and never past
# GPU_CHECK_BUDGET seconds from the start, default 540: a machine lent for ten minutes a command
# gets its report back); a step reached with under 10 s left is not started (reported as such).
#
# Environment: MEGATRON_LM (a Megatron-LM checkout, core_v0.16 - core_v0.19 or main; step 5 fails
# without it, saying so), PYTHON (default python, else python3), GPU_CHECK_QUICK=1 (zeppelin profile
# --quick), GPU_CHECK_ONLY (the steps to run, e.g. "3 4a 4b"; default all), GPU_CHECK_BUDGET,
# GPU_CHECK_STEP_LIMIT, GPU_CHECK_SCRATCH (dataset, TensorBoard, kit packages; default a new temporary
# folder), ZEPPELIN_KIT (a folder made by scripts/device_kit.sh for a machine without a package index:
# its wheels are installed into scratch and put on PYTHONPATH, and its Megatron-LM checkout is
# MEGATRON_LM unless that is set). Without an installed zeppelin_megatron this checkout is put on
# PYTHONPATH.
set -uo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
START=$SECONDS
if [ -z "${PYTHON:-}" ]; then
    PYTHON=python
    command -v python >/dev/null 2>&1 || PYTHON=python3
fi
OUT=${1:-gpu_check_out/$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
SCRATCH=${GPU_CHECK_SCRATCH:-$(mktemp -d)}
mkdir -p "$SCRATCH"
BUDGET=${GPU_CHECK_BUDGET:-540}
REPORT=$OUT/report.md
FAILED=0
export REPO OUT SCRATCH PYTHON

if [ -n "${ZEPPELIN_KIT:-}" ]; then
    KIT=$(cd "$ZEPPELIN_KIT" && pwd) || { echo "ZEPPELIN_KIT=$ZEPPELIN_KIT is not a folder" >&2; exit 64; }
    if compgen -G "$KIT/wheels/*.whl" >/dev/null; then
        "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target "$SCRATCH/site" "$KIT"/wheels/*.whl || { echo "installing $KIT/wheels failed" >&2; exit 65; }
        export PYTHONPATH="$SCRATCH/site${PYTHONPATH:+:$PYTHONPATH}"
    fi
    [ -z "${MEGATRON_LM:-}" ] && [ -d "$KIT/megatron-lm" ] && export MEGATRON_LM="$KIT/megatron-lm"
fi
if ! "$PYTHON" -c 'import zeppelin_megatron' >/dev/null 2>&1; then
    export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
fi

{
    echo "# gpu_check report"
    echo
    echo "- date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "- host: $(hostname)"
    echo "- commit: $(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo unknown)"
    echo "- Megatron-LM: ${MEGATRON_LM:-not set} $(git -C "${MEGATRON_LM:-/nonexistent}" describe --tags --always 2>/dev/null)"
    echo "- kit: ${ZEPPELIN_KIT:-none}; budget: ${BUDGET} s"
    echo
} > "$REPORT"

# step ID NAME LOG LIMIT CMD...: run CMD (a command or one of the functions below) with its output in OUT/LOG,
# under min(LIMIT, GPU_CHECK_STEP_LIMIT, what is left of the budget) seconds, and add a section with its
# status, time and tail. Skipped (not counted) when GPU_CHECK_ONLY does not name ID.
step() {
    local id=$1 name=$2 log=$3 limit=$4
    shift 4
    if [ -n "${GPU_CHECK_ONLY:-}" ] && [[ " $GPU_CHECK_ONLY " != *" $id "* ]]; then
        return 0
    fi
    [ -n "${GPU_CHECK_STEP_LIMIT:-}" ] && [ "$GPU_CHECK_STEP_LIMIT" -lt "$limit" ] && limit=$GPU_CHECK_STEP_LIMIT
    local left=$((BUDGET - (SECONDS - START)))
    [ "$left" -lt "$limit" ] && limit=$left
    echo "== $id. $name (limit ${limit} s)"
    local t0=$SECONDS rc status
    if [ "$limit" -lt 10 ]; then
        rc=125
        status="NOT RUN: ${left} s of the ${BUDGET} s budget left"
        echo "$status" > "$OUT/$log"
    else
        timeout --kill-after=15 "$limit" bash -c '"$@"' step "$@" > "$OUT/$log" 2>&1
        rc=$?
        case $rc in
            0) status=ok ;;
            124 | 137) status="TIMED OUT after ${limit} s" ;;
            *) status=FAILED ;;
        esac
    fi
    local took=$((SECONDS - t0))
    [ "$rc" -ne 0 ] && FAILED=$((FAILED + 1))
    {
        echo "## $id. $name"
        echo
        echo "- command: \`$*\`"
        echo "- exit code: $rc ($status), ${took} s; full log: \`$log\` (in logs.tar.gz)"
        echo
        if [ "$rc" -ne 0 ] && grep -q -m 1 -E "Error|Traceback|assert" "$OUT/$log"; then
            echo "first error lines:"
            echo '```'
            grep -n -m 8 -E "Error|Traceback|assert" "$OUT/$log"
            echo '```'
            echo
        fi
        echo '```'
        tail -n 40 "$OUT/$log"
        echo '```'
        echo
    } >> "$REPORT"
    echo "   exit $rc ($status), ${took} s"
}

environment() {
    nvidia-smi || return 1
    nvidia-smi topo -m || true
    "$PYTHON" - <<'EOF'
import importlib, sys
import torch
print("python", sys.version.split()[0])
print("torch", torch.__version__, "cuda", torch.version.cuda, "devices", torch.cuda.device_count())
for i in range(torch.cuda.device_count()):
    print(" ", i, torch.cuda.get_device_name(i))
for name in ("megatron.core", "flash_attn", "transformer_engine", "triton", "zeppelin_megatron"):
    try:
        m = importlib.import_module(name)
        print(name, getattr(m, "__version__", "?"), getattr(m, "__file__", ""))
    except Exception as exc:  # noqa: BLE001 - report, don't stop
        print(name, "not importable:", exc)
assert torch.cuda.is_available(), "torch sees no CUDA device"
EOF
}

lengths_1m() {  # one step of 1M tokens (1048576) of arxiv-64k lengths, seed 0
    "$PYTHON" - "$OUT/lengths_1m.txt" <<'EOF'
import sys
from zeppelin_megatron.sim.lengths import sample_steps
(step,) = sample_steps("arxiv-64k", 1, 1 << 20, 0)
with open(sys.argv[1], "w") as f:
    f.write("# arxiv-64k, 1 step of 1048576 tokens, seed 0\n")
    f.writelines(f"{n}\n" for n in step)
print(len(step), "sequences,", sum(step), "tokens ->", sys.argv[1])
EOF
}

small_dataset() {  # a small Megatron indexed dataset with long-tailed document lengths (zeppelin demo's corpus)
    "$PYTHON" - "$SCRATCH/data/corpus" <<'EOF'
import sys
from zeppelin_megatron.megatron.demo import DemoConfig, write_corpus
prefix = write_corpus(sys.argv[1], DemoConfig(documents=2000, seq_length=4096, tokens_per_step=32768, vocab=256))
print("wrote", prefix + ".bin/.idx")
EOF
}

pretrain_10() {
    [ -n "${MEGATRON_LM:-}" ] || { echo "MEGATRON_LM is not set (nor a kit's megatron-lm): not run"; return 1; }
    small_dataset || return 1
    local impl=local profile=()
    [ -f "$OUT/profile.json" ] && profile=(--zeppelin-profile "$OUT/profile.json")
    "$PYTHON" -c 'import transformer_engine' 2>/dev/null && impl=transformer_engine
    CUDA_DEVICE_MAX_CONNECTIONS=1 "$PYTHON" -m torch.distributed.run --standalone --nproc-per-node 1 \
        scripts/pretrain_gpt_zeppelin.py --megatron-lm "$MEGATRON_LM" \
        --zeppelin --zeppelin-cluster 1x1 "${profile[@]}" \
        --num-layers 4 --hidden-size 512 --num-attention-heads 8 --group-query-attention --num-query-groups 4 \
        --swiglu --normalization RMSNorm --position-embedding-type rope --untie-embeddings-and-output-weights \
        --seq-length 4096 --max-position-embeddings 4096 --micro-batch-size 2 --global-batch-size 4 \
        --train-iters 10 --lr 3e-4 --min-lr 3e-5 --lr-decay-style cosine --lr-warmup-iters 2 \
        --bf16 --transformer-impl "$impl" --tokenizer-type NullTokenizer --vocab-size 256 \
        --data-path "$SCRATCH/data/corpus" --split 100,0,0 --eval-iters 0 --log-interval 1 \
        --tensorboard-dir "$SCRATCH/tensorboard"
}
export -f environment lengths_1m small_dataset pretrain_10

step 1 "environment" env.log 60 environment
step 2 "gpu-marked tests" pytest_gpu.log 150 "$PYTHON" -m pytest -q -m gpu -p no:cacheprovider
step 3 "zeppelin profile (GPU 0)" profile.log 150 \
    "$PYTHON" -m zeppelin_megatron.cli profile --out "$OUT/profile.json" --device cuda:0 \
    ${GPU_CHECK_QUICK:+--quick}
step 4a "1M-token lengths" lengths.log 60 lengths_1m
step 4b "zeppelin replay, 4x8 plan of 1M tokens vs the profile" replay.log 150 \
    "$PYTHON" -m zeppelin_megatron.cli replay --lengths "$OUT/lengths_1m.txt" \
    --cluster "4x8@$REPO/configs/clusters/h100.yaml" --strategies zeppelin,te-cp \
    --profile "$OUT/profile.json" --device cuda:0 --ideal --json "$OUT/replay.json"
step 5 "pretrain_gpt.py --zeppelin, 10 iterations on 1 GPU" pretrain.log 240 pretrain_10

(cd "$OUT" && shopt -s nullglob && files=(*.log lengths_1m*.txt) && [ ${#files[@]} -gt 0 ] \
    && tar czf logs.tar.gz "${files[@]}" && rm -f "${files[@]}")
{
    echo "## Summary"
    echo
    echo "$FAILED step(s) failed or ran out of time, $((SECONDS - START)) s in all. Files: \`$OUT\`."
} >> "$REPORT"
echo "report: $REPORT ($FAILED failed)"
exit "$FAILED"
