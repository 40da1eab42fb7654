#!/usr/bin/env bash
# device_kit.sh: what scripts/gpu_check.sh needs on a GPU machine that cannot reach a package index, in one
# folder to copy there (ZEPPELIN_KIT=that folder). Run it here, where pip can download.
#
#   bash scripts/device_kit.sh KIT_DIR [PYTHON_VERSION] [MEGATRON_LM_SOURCE]
#
# KIT_DIR/wheels/: megatron-core for that Python (the line pyproject.toml's extras pin: 0.16.1 for
#   Python 3.10-3.11, 0.19.x for 3.12 and later; PYTHON_VERSION default 3.12, e.g. an image's python3),
#   built for manylinux x86-64, without its dependencies (torch, numpy and packaging, which a GPU image
#   has), plus six and regex (Megatron-LM's megatron/training imports them).
# KIT_DIR/megatron-lm/: the parts of a Megatron-LM checkout that step 5 runs (its top-level *.py, among
#   them pretrain_gpt.py, gpt_builders.py and model_provider.py, megatron/ and LICENSE; not its tests,
#   docs, examples or tools: about 11 MB of the 66 MB tree at core_v0.19.0): from MEGATRON_LM_SOURCE (a
#   checkout), or, from a git repository given as SOURCE@REF (e.g. /path/Megatron-LM@core_v0.19.0), that
#   ref's tree. Without a source, none (gpu_check.sh's step 5 then needs MEGATRON_LM on the machine). The
#   snapshots in tests/fixtures/megatron-lm/ are not enough: they lack gpt_builders.py and
#   model_provider.py.
# KIT_DIR/KIT.txt: what is in it. Exit 1 (naming what failed) when a download or the copy fails.
#
# Example (the 'device' workplace's H200 image: Python 3.12 with torch, no index; the kit in the checkout,
# ignored by git, carried along):
#   bash scripts/device_kit.sh .device_kit 3.12 /path/to/Megatron-LM@core_v0.19.0
#   ZEPPELIN_KIT=.device_kit GPU_CHECK_BUDGET=540 bash scripts/gpu_check.sh "$OUT"
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: $0 KIT_DIR [PYTHON_VERSION] [MEGATRON_LM_SOURCE[@REF]]" >&2; exit 64; }
KIT=$1
PYV=${2:-3.12}
SOURCE=${3:-}
PY=${PYTHON:-python3}
case $PYV in
    3.10 | 3.11) MCORE="megatron-core==0.16.1" ;;
    3.1[2-9]) MCORE="megatron-core>=0.19,<0.20" ;;
    *) echo "PYTHON_VERSION must be 3.10-3.19, got $PYV" >&2; exit 64 ;;
esac
mkdir -p "$KIT/wheels"
PLATFORMS=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 \
         manylinux2014_x86_64 manylinux1_x86_64; do
    PLATFORMS+=(--platform "$p")
done
for spec in "$MCORE" six regex; do
    "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$PYV" --implementation cp \
        "${PLATFORMS[@]}" -d "$KIT/wheels" "$spec" \
        || { echo "downloading $spec for Python $PYV failed" >&2; exit 1; }
done
if [ -n "$SOURCE" ]; then
    rm -rf "$KIT/megatron-lm"
    mkdir -p "$KIT/megatron-lm"
    tree=$SOURCE
    if [[ "$SOURCE" == *@* ]]; then
        repo=${SOURCE%@*} ref=${SOURCE##*@}
        tree=$(mktemp -d)
        trap 'rm -rf "$tree"' EXIT
        git -C "$repo" archive "$ref" | tar -x -C "$tree" || { echo "git archive $ref of $repo failed" >&2; exit 1; }
    fi
    [ -f "$tree/pretrain_gpt.py" ] && [ -d "$tree/megatron" ] \
        || { echo "$SOURCE has no pretrain_gpt.py and megatron/: not a Megatron-LM checkout" >&2; exit 1; }
    (cd "$tree" && tar -c --exclude='__pycache__' ./*.py ./megatron $(ls LICENSE 2>/dev/null)) \
        | tar -x -C "$KIT/megatron-lm" || { echo "copying $SOURCE failed" >&2; exit 1; }
    [ -f "$KIT/megatron-lm/pretrain_gpt.py" ] || { echo "$SOURCE gave no pretrain_gpt.py" >&2; exit 1; }
fi
{
    echo "kit for Python $PYV, made $(date -u +%Y-%m-%dT%H:%M:%SZ) by scripts/device_kit.sh"
    echo "wheels:"
    ls "$KIT/wheels" | sed 's/^/  /'
    echo "megatron-lm: ${SOURCE:-none}"
} > "$KIT/KIT.txt"
du -sh "$KIT"
cat "$KIT/KIT.txt"
