#!/usr/bin/env bash
# Reproduce the published GPU figures (benchmark/results/H100, H200), one stage at a time; each
# stage fits in about ten minutes on one H100 or H200 (tp and hybrid-tp need two GPUs):
#   scripts/gpu_validate.sh STAGE OUT
# The stages live by area in scripts/gpu/ (models.sh, kernels.sh, serving.sh), each
# file saying what its stages run; scripts/gpu_validate.sh alone lists them.
# Logs and result files go to OUT; OUT.tgz packs them. PYTHON picks the interpreter (python3).
# On a machine whose copy of the tree has no current .git, set MINISGL_COMMIT to the commit run:
# the result files record it.
set -uo pipefail
stage=${1:-} out=${2:-}
models="families tests tp gpt-oss gpt-oss-ab gpt-oss-profile gemma hybrid-tests hybrid hybrid-online images
    hybrid-big hybrid-27b hybrid-tp"
kernels="moe-tests moe-ncu moe-tune moe-tune-gluon moe-tune-bf16 moe-ab moe-gluon moe-gluon-sweep moe-ncu-gluon
    moe-gluon-ab moe-tk moe-fi attn-wide autotune-choices fi fi-tests fi-kernels fi-offline"
serving="offline sampling structured fp8 online itl itl-shared short-behind-long first-minute spec
    spec-hybrid spec-eagle3"
area=""
for a in models kernels serving; do  # the file that holds the stage
    for s in ${!a}; do [ "$s" = "$stage" ] && area=$a; done
done
if [ -z "$area" ] || [ -z "$out" ]; then
    echo "usage: $0 STAGE OUT; the stages, by file of scripts/gpu/:" >&2
    for a in models kernels serving; do echo "  $a.sh:" ${!a} >&2; done
    exit 2
fi
py=${PYTHON:-python3}
cd "$(dirname "$0")/.."
mkdir -p "$out"
export HF_HUB_OFFLINE=1 MINISGL_TEST_DEVICE=cuda
m06=benchmark/configs/qwen3-0.6b.json m8=benchmark/configs/qwen3-8b.json
moss=benchmark/configs/gpt-oss-20b.json
step() {  # step SECONDS CMD...: one step under a time limit, its wall time printed
    local limit=$1 t0=$SECONDS
    shift
    timeout -k 10 "$limit" "$@"
    local rc=$?
    echo "[$stage] ${*: -1} rc=$rc $((SECONDS - t0))s" >&2
    return $rc
}
bench=("$py" benchmark/offline/bench.py --out "$out")  # the offline benchmark, results in OUT
source "scripts/gpu/$area.sh"
tar -czf "$out.tgz" -C "$(dirname "$out")" "$(basename "$out")"
