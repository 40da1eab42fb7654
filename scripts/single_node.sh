#!/bin/bash
# Zeppelin pretraining on one node: torchrun with one process per GPU.
#
#   MEGATRON_LM=/path/to/Megatron-LM DATA_PREFIX=/data/corpus_text_document TOKENIZER_MODEL=... \
#       bash scripts/single_node.sh [extra Megatron / --zeppelin* flags]
#
# RECIPE (default configs/recipes/llama7b_4x8_h100.sh) supplies the flags; it is sourced with
# NNODES=1 and GPUS_PER_NODE (default: GPUs nvidia-smi lists). Flags given here are appended
# (the last occurrence of a flag wins in argparse). MEGATRON_LM names a Megatron-LM checkout,
# core_v0.16 - core_v0.19 or main (see patches/README.md).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
: "${MEGATRON_LM:?set MEGATRON_LM to a Megatron-LM checkout (core_v0.16 - core_v0.19 or main)}"
RECIPE="${RECIPE:-$REPO/configs/recipes/llama7b_4x8_h100.sh}"
if [[ -z "${GPUS_PER_NODE:-}" ]]; then
    GPUS_PER_NODE="$(nvidia-smi --list-gpus | wc -l)"
fi
NNODES=1
export NNODES GPUS_PER_NODE MEGATRON_LM

# Tensor/context parallel communication ordering (Megatron asserts it with TP > 1 before Blackwell).
export CUDA_DEVICE_MAX_CONNECTIONS="${CUDA_DEVICE_MAX_CONNECTIONS:-1}"
export TORCH_NCCL_ASYNC_ERROR_HANDLING="${TORCH_NCCL_ASYNC_ERROR_HANDLING:-1}"
export NCCL_DEBUG="${NCCL_DEBUG:-WARN}"
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"

# shellcheck source=/dev/null
source "$RECIPE"

exec torchrun --standalone --nnodes 1 --nproc-per-node "$GPUS_PER_NODE" --no-python \
    "$REPO/scripts/bind_gpu_numa.sh" python "$REPO/scripts/pretrain_gpt_zeppelin.py" \
    --megatron-lm "$MEGATRON_LM" "${RECIPE_ARGS[@]}" "$@"
