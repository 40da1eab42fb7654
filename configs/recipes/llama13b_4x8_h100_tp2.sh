# shellcheck shell=bash
# Recipe: Llama-13B (LLaMA-1 shape) with Zeppelin on 4 nodes x 8 H100 (80 GB), TP 2 + sequence
# parallelism: 16 Zeppelin ranks (4 per node), each a TP pair holding 65536 tokens.
#
# The Llama-7B recipe with the 13B shape on top (argparse keeps the last value of a flag).
# Inputs as in llama7b_4x8_h100.sh. Memory at 65536 tokens per TP pair is estimated, not
# measured: about 13 GB weights + 26 GB fp32 gradients + 5 GB optimizer shard + 14 GB layer
# inputs kept by full recomputation, per GPU.

TP="${TP:-2}"
CKPT_DIR="${CKPT_DIR:-$PWD/checkpoints/llama13b-zeppelin}"
# shellcheck source=configs/recipes/llama7b_4x8_h100.sh
source "$(dirname "${BASH_SOURCE[0]}")/llama7b_4x8_h100.sh"

RECIPE_ARGS+=(
    --num-layers 40
    --hidden-size 5120
    --num-attention-heads 40
    --ffn-hidden-size 13824
    --sequence-parallel
)
