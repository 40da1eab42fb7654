#!/bin/bash
# Run a command bound to the CPU cores and memory of the NUMA node nearest to this rank's GPU.
#
# Used by scripts/single_node.sh and scripts/slurm_multi_node.sbatch as torchrun's per-rank
# program (torchrun --no-python ... scripts/bind_gpu_numa.sh python ...). LOCAL_RANK (set by
# torchrun) selects the GPU; its NUMA node comes from /sys/bus/pci/devices/<bus id>/numa_node.
# Without numactl or nvidia-smi, or when the node is unknown (-1), the command runs unbound.
# Set ZEPPELIN_NUMA_BIND=0 to disable binding.
set -euo pipefail

local_rank="${LOCAL_RANK:-0}"
if [[ "${ZEPPELIN_NUMA_BIND:-1}" != "0" ]] && command -v numactl >/dev/null && command -v nvidia-smi >/dev/null; then
    bus_id="$(nvidia-smi --query-gpu=pci.bus_id --format=csv,noheader -i "$local_rank" | tr '[:upper:]' '[:lower:]')"
    # nvidia-smi prints 00000000:18:00.0; sysfs names it 0000:18:00.0
    sysfs="/sys/bus/pci/devices/${bus_id#0000}/numa_node"
    node="$(cat "$sysfs" 2>/dev/null || echo -1)"
    if [[ "$node" =~ ^[0-9]+$ ]]; then
        exec numactl --cpunodebind="$node" --membind="$node" "$@"
    fi
fi
exec "$@"
