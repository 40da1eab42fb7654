# shellcheck shell=bash
# Recipe: a small GPT (8 layers, hidden 1024) for checking an installation or a cluster in
# minutes: 50 steps, sequences of up to 16384 tokens, no checkpoints, metrics every step.
# Works on any node count (the launchers set NNODES and GPUS_PER_NODE).
#
#   RECIPE=configs/recipes/smoke_gpt.sh bash scripts/single_node.sh
#
# Inputs: DATA_PREFIX (one prefix, or a blend "W1 P1 W2 P2"), TOKENIZER_MODEL (HuggingFace tokenizer used for it);
# or DATA_PREFIX=mock: Megatron's --mock-data (megatron-core's 100,000 mock documents of 1-4,095 tokens, no files
# needed) with a NullTokenizer of VOCAB_SIZE (default 32000) tokens.

: "${NNODES:?NNODES must be set by the launcher}"
: "${GPUS_PER_NODE:?GPUS_PER_NODE must be set by the launcher}"
: "${DATA_PREFIX:?set DATA_PREFIX to an indexed dataset prefix (path without .bin/.idx), a blend W1 P1 W2 P2, or mock}"
if [[ "$DATA_PREFIX" == mock ]]; then
    DATA_ARGS=(--mock-data --tokenizer-type NullTokenizer --vocab-size "${VOCAB_SIZE:-32000}")
else
    read -r -a DATA_PATH <<< "$DATA_PREFIX"  # one prefix, or a blend: "0.3 /data/a 0.7 /data/b"
    : "${TOKENIZER_MODEL:?set TOKENIZER_MODEL to the tokenizer used to make DATA_PREFIX}"
    DATA_ARGS=(--data-path "${DATA_PATH[@]}" --split 100,0,0
               --tokenizer-type HuggingFaceTokenizer --tokenizer-model "$TOKENIZER_MODEL")
fi

RECIPE_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ZEPPELIN_REPO="${ZEPPELIN_REPO:-$(cd "$RECIPE_DIR/../.." && pwd)}"
SEQ_LENGTH="${SEQ_LENGTH:-16384}"
ZEPPELIN_RANKS=$(( NNODES * GPUS_PER_NODE ))

RECIPE_ARGS=(
    --zeppelin
    --zeppelin-cluster "${NNODES}x${GPUS_PER_NODE}@${ZEPPELIN_REPO}/configs/clusters/h100.yaml"
    --num-layers 8
    --hidden-size 1024
    --num-attention-heads 16
    --group-query-attention
    --num-query-groups 4
    --ffn-hidden-size 2816
    --swiglu
    --normalization RMSNorm
    --position-embedding-type rope
    --untie-embeddings-and-output-weights
    --disable-bias-linear
    --attention-dropout 0.0
    --hidden-dropout 0.0
    --transformer-impl "${TRANSFORMER_IMPL:-local}"
    --max-position-embeddings "$SEQ_LENGTH"
    --seq-length "$SEQ_LENGTH"
    --micro-batch-size 1
    --global-batch-size "$ZEPPELIN_RANKS"
    --bf16
    "${DATA_ARGS[@]}"
    --train-iters 50
    --lr 3e-4
    --lr-warmup-iters 5
    --lr-decay-style cosine
    --log-interval 1
    --eval-iters 0
)
