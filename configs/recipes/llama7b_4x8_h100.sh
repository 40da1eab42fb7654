# shellcheck shell=bash
# Recipe: Llama-7B (LLaMA-1 shape) with Zeppelin on 4 nodes x 8 H100 (80 GB), long-tailed data.
#
# Sourced by scripts/slurm_multi_node.sbatch and scripts/single_node.sh, which set NNODES and
# GPUS_PER_NODE; it defines RECIPE_ARGS, the full flag list for scripts/pretrain_gpt_zeppelin.py.
#
# Inputs (environment):
#   DATA_PREFIX      indexed dataset prefix (.bin/.idx from Megatron-LM's tools/preprocess_data.py
#                    with --append-eod); one prefix, or a blend in Megatron's form "W1 P1 W2 P2"
#                    (weights are shares of the tokens); documents kept whole (truncated at SEQ_LENGTH)
#   TOKENIZER_MODEL  HuggingFace tokenizer name or path used to make DATA_PREFIX
#   VALID_PREFIX     optional validation prefix (else no evaluation: --eval-iters 0)
#   CKPT_DIR         checkpoints (default ./checkpoints/llama7b-zeppelin); TB_DIR tensorboard logs
#   ZEPPELIN_REPO    this repository (default: two levels above this file)
#   TRANSFORMER_IMPL local (default) or transformer_engine (needs Transformer Engine)
#
# Sizing. seq_length 65536 x micro-batch 1 = 65536 tokens per GPU = tokens_per_gpu of
# configs/clusters/h100.yaml (checked at start-up). One micro-step plans 65536 x 32 = 2.1M tokens
# over the 32 GPUs; GLOBAL_BATCH_SIZE 64 = 2 micro-steps = 4.2M tokens per optimizer step.
# Documents longer than 65536 tokens are truncated (raise SEQ_LENGTH together with
# --zeppelin-tokens-per-gpu and recomputation if your GPUs hold more).

: "${NNODES:?NNODES must be set by the launcher}"
: "${GPUS_PER_NODE:?GPUS_PER_NODE must be set by the launcher}"
: "${DATA_PREFIX:?set DATA_PREFIX to an indexed dataset prefix (path without .bin/.idx), or a blend W1 P1 W2 P2}"
read -r -a DATA_PATH <<< "$DATA_PREFIX"  # one prefix, or a blend: "0.3 /data/a 0.7 /data/b"
: "${TOKENIZER_MODEL:?set TOKENIZER_MODEL to the tokenizer used to make DATA_PREFIX}"

RECIPE_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ZEPPELIN_REPO="${ZEPPELIN_REPO:-$(cd "$RECIPE_DIR/../.." && pwd)}"
SEQ_LENGTH="${SEQ_LENGTH:-65536}"
TP="${TP:-1}"
ZEPPELIN_RANKS=$(( NNODES * GPUS_PER_NODE / TP ))
GLOBAL_BATCH_SIZE="${GLOBAL_BATCH_SIZE:-$(( 2 * ZEPPELIN_RANKS ))}"
CKPT_DIR="${CKPT_DIR:-$PWD/checkpoints/llama7b-zeppelin}"
TB_DIR="${TB_DIR:-$CKPT_DIR/tensorboard}"
TRANSFORMER_IMPL="${TRANSFORMER_IMPL:-local}"

RECIPE_ARGS=(
    # Zeppelin
    --zeppelin
    --zeppelin-cluster "${NNODES}x${GPUS_PER_NODE}@${ZEPPELIN_REPO}/configs/clusters/h100.yaml"
    --zeppelin-routing
    --zeppelin-remap
    # model: LLaMA-1 7B
    --num-layers 32
    --hidden-size 4096
    --num-attention-heads 32
    --ffn-hidden-size 11008
    --swiglu
    --normalization RMSNorm
    --position-embedding-type rope
    --rotary-base 10000
    --untie-embeddings-and-output-weights
    --disable-bias-linear
    --attention-dropout 0.0
    --hidden-dropout 0.0
    --init-method-std 0.02
    --transformer-impl "$TRANSFORMER_IMPL"
    --max-position-embeddings "$SEQ_LENGTH"
    # parallelism and memory: data parallel over all GPUs (TP optional), sharded optimizer,
    # full activation recomputation (65536 tokens per GPU)
    --tensor-model-parallel-size "$TP"
    --pipeline-model-parallel-size 1
    --context-parallel-size 1
    --use-distributed-optimizer
    --overlap-grad-reduce
    --recompute-granularity full
    --recompute-method uniform
    --recompute-num-layers 1
    --bf16
    # batch: one Megatron sample = SEQ_LENGTH tokens of budget
    --seq-length "$SEQ_LENGTH"
    --micro-batch-size 1
    --global-batch-size "$GLOBAL_BATCH_SIZE"
    # data (the launcher adds --dataloader-type external and --calculate-per-token-loss)
    --data-path "${DATA_PATH[@]}"
    --split 100,0,0
    --tokenizer-type HuggingFaceTokenizer
    --tokenizer-model "$TOKENIZER_MODEL"
    --seed 1234
    # optimisation
    --train-iters 5000
    --lr 3e-4
    --min-lr 3e-5
    --lr-decay-style cosine
    --lr-warmup-iters 200
    --weight-decay 0.1
    --adam-beta1 0.9
    --adam-beta2 0.95
    --clip-grad 1.0
    # logging and checkpoints
    --log-interval 1
    --log-throughput
    --tensorboard-dir "$TB_DIR"
    --tensorboard-log-interval 1
    --save "$CKPT_DIR"
    --load "$CKPT_DIR"
    --save-interval 500
)

if [[ -n "${VALID_PREFIX:-}" ]]; then
    RECIPE_ARGS+=(--valid-data-path "$VALID_PREFIX" --eval-interval 500 --eval-iters 4)
else
    RECIPE_ARGS+=(--eval-iters 0)
fi
