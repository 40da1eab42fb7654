#!/usr/bin/env bash
# gpu_check.sh: the first checks to run on a machine with NVIDIA GPUs, in one command, one report.
#
# NOT RUN YET. Written on CPU-only machines (no GPU machine was available when it was written);
# expect the first run to need fixes. Put its report in docs/measure.md when it has run. Only step 5's
# command line was checked, on CPU: it passes Zeppelin's start-up check and stops at Megatron's
# "Megatron requires CUDA." assertion (core_v0.16.1 snapshot).
#
#   MEGATRON_LM=/path/to/Megatron-LM bash scripts/gpu_check.sh [OUT_DIR]
#
# Steps (each one runs even when an earlier one failed; the report says which failed):
#   1. environment: nvidia-smi, Python, torch/CUDA, megatron-core, flash-attn, Transformer Engine;
#   2. the gpu-marked tests: python -m pytest -q -m gpu;
#   3. zeppelin profile on GPU 0 (bf16) -> OUT/profile.json;
#   4. zeppelin replay of a 32-rank (4x8 H100 cluster file) plan of 1M tokens (arxiv-64k lengths,
#      seed 0) against that profile: measured per-rank kernel time vs the cost model's prediction;
#   5. 10 iterations of Megatron-LM's pretrain_gpt.py with --zeppelin on one GPU (the launcher,
#      scripts/pretrain_gpt_zeppelin.py), a small GPT on a small indexed dataset written here.
# Writes OUT/report.md (and each step's full log next to it). Exit code: number of failed steps.
#
# Environment: MEGATRON_LM (a Megatron-LM checkout, core_v0.16 - core_v0.19 or main; step 5 is
# skipped without it), PYTHON (default python), GPU_CHECK_QUICK=1 (zeppelin profile --quick).
set -uo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
PYTHON=${PYTHON:-python}
OUT=${1:-gpu_check_out/$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
REPORT=$OUT/report.md
FAILED=0

{
    echo "# gpu_check report"
    echo
    echo "- date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "- host: $(hostname)"
    echo "- commit: $(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo unknown)"
    echo "- Megatron-LM: ${MEGATRON_LM:-not set} $(git -C "${MEGATRON_LM:-/nonexistent}" describe --tags --always 2>/dev/null)"
    echo
} > "$REPORT"

# step NAME LOG CMD...: run CMD with its output in OUT/LOG, add a section with its status and tail.
step() {
    local name=$1 log=$2
    shift 2
    echo "== $name"
    local t0=$SECONDS rc
    "$@" > "$OUT/$log" 2>&1
    rc=$?
    local took=$((SECONDS - t0))
    [ "$rc" -ne 0 ] && FAILED=$((FAILED + 1))
    {
        echo "## $name"
        echo
        echo "- command: \`$*\`"
        echo "- exit code: $rc ($([ "$rc" -eq 0 ] && echo ok || echo FAILED)), ${took} s; full log: \`$log\`"
        echo
        echo '```'
        tail -n 40 "$OUT/$log"
        echo '```'
        echo
    } >> "$REPORT"
    echo "   exit $rc, ${took} s"
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
for name in ("megatron.core", "flash_attn", "transformer_engine", "zeppelin_megatron"):
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
    "$PYTHON" - "$OUT/data/corpus" <<'EOF'
import sys
from zeppelin_megatron.megatron.demo import DemoConfig, write_corpus
prefix = write_corpus(sys.argv[1], DemoConfig(documents=2000, seq_length=4096, tokens_per_step=32768, vocab=256))
print("wrote", prefix + ".bin/.idx")
EOF
}

pretrain_10() {
    [ -n "${MEGATRON_LM:-}" ] || { echo "MEGATRON_LM is not set: skipped"; return 1; }
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
        --data-path "$OUT/data/corpus" --split 100,0,0 --eval-iters 0 --log-interval 1 \
        --tensorboard-dir "$OUT/tensorboard"
}

step "1. environment" env.log environment
step "2. gpu-marked tests" pytest_gpu.log "$PYTHON" -m pytest -q -m gpu
step "3. zeppelin profile (GPU 0)" profile.log \
    "$PYTHON" -m zeppelin_megatron.cli profile --out "$OUT/profile.json" --device cuda:0 \
    ${GPU_CHECK_QUICK:+--quick}
step "4a. 1M-token lengths" lengths.log lengths_1m
step "4b. zeppelin replay, 4x8 plan of 1M tokens vs the profile" replay.log \
    "$PYTHON" -m zeppelin_megatron.cli replay --lengths "$OUT/lengths_1m.txt" \
    --cluster "4x8@$REPO/configs/clusters/h100.yaml" --strategies zeppelin,te-cp \
    --profile "$OUT/profile.json" --device cuda:0 --ideal --json "$OUT/replay.json"
step "5. pretrain_gpt.py --zeppelin, 10 iterations on 1 GPU" pretrain.log pretrain_10

{
    echo "## Summary"
    echo
    echo "$FAILED step(s) failed. Files: \`$OUT\`."
} >> "$REPORT"
echo "report: $REPORT ($FAILED failed)"
exit "$FAILED"
