#!/usr/bin/env bash
# Streaming smoothness on one GPU with random weights: schedule modes side by side on one machine.
#   benchmark/online/gpu_itl.sh qwen3-8b   OUT  # concurrency 4, 16, 64
#   benchmark/online/gpu_itl.sh qwen3-0.6b OUT  # concurrency 128
#   benchmark/online/gpu_itl.sh shared     OUT  # Qwen3-8B, shared-prefix workload: lpm vs fcfs
# Workload: random token prompts of 512-1024 tokens, 128-256 output tokens, streaming
# /v1/completions with ignore_eos, all sent at once and at most CONCURRENCY in flight, ROUNDS x
# concurrency requests per run. Each server is warmed up with one unmeasured run first (Triton
# compiles its kernel variants for mixed steps then). The model stages serve prefill-first, then
# mixed once per budget in BUDGETS (--max-num-batched-tokens), and write OUT/<model>_<gpu>_itl.md.
# Env: PYTHON (python3), PORT (1919), CONCURRENCIES (qwen3-8b: "4,16,64"), BUDGETS ("512 1024 2048"; "default": the server's own budget),
# SERVER_ARGS (more server flags), ROUNDS (4), MODES (prefill-first and mixed-BUDGET for each budget; a baseline measured earlier in
# the same call may be left out and its JSON put into OUT first).
set -euo pipefail
stage=$1 out=$2
here=$(cd "$(dirname "$0")" && pwd)
source "$here/gpu_common.sh"
budgets=${BUDGETS:-512 1024 2048}
rounds=${ROUNDS:-4}
mkdir -p "$out"

itl=(--dataset random --input-len 512,1024 --output-len 128,256)

run_modes() {  # run_modes CONCURRENCIES MAX_ITL_MS [itl_summary flags...]
    local concurrencies=$1 max_itl=$2 top=${1##*,}
    shift 2
    local name="${tag}_${gpu}_itl"
    local modes=${MODES:-prefill-first $(for b in $budgets; do echo "mixed-$b"; done)}
    for mode in $modes; do
        if [ "$mode" = prefill-first ]; then
            serve "${name}_$mode" --schedule-mode prefill-first
        elif [ "$mode" = mixed-default ]; then
            serve "${name}_$mode" --schedule-mode mixed
        else
            serve "${name}_$mode" --schedule-mode mixed --max-num-batched-tokens "${mode#mixed-}"
        fi
        bench "${itl[@]}" --concurrencies "$top" --rounds 1 --seed 99 --out "$out/warmup" \
              --tag "${name}_${mode}_warmup" >/dev/null
        bench "${itl[@]}" --concurrencies "$concurrencies" --rounds "$rounds" --tag "${name}_$mode"
        stop
    done
    "$py" "$here/itl_summary.py" --baseline "$out/${name}_prefill-first.json" \
        "$out/${name}"_mixed-*.json --max-itl-ms "$max_itl" --out "$out/${name}.md" "$@"
}

case $stage in
qwen3-8b|qwen3-0.6b)
    tag=$stage model=$(mktemp -d)/$stage
    "$py" "$here/dummy_model.py" "$here/../configs/$stage.json" "$model" >/dev/null
    if [ "$stage" = qwen3-8b ]; then run_modes "${CONCURRENCIES:-4,16,64}" 250; else run_modes 128 150 --max-itl-only; fi ;;
shared)
    tag=qwen3-8b model=$(mktemp -d)/qwen3-8b
    "$py" "$here/dummy_model.py" "$here/../configs/qwen3-8b.json" "$model" >/dev/null
    shared=(--dataset shared-prefix --groups 8 --per-group 32 --prefix-len 2048 --question-len 64
            --output-len 64 --request-rates inf)
    for policy in lpm fcfs; do
        serve "${tag}_shared_$policy" --schedule-policy "$policy"
        bench "${shared[@]}" --tag "${tag}_${gpu}_shared_prefix_$policy"
        stop
    done
    bench --compare "$out/${tag}_${gpu}_shared_prefix_lpm.json" \
          "$out/${tag}_${gpu}_shared_prefix_fcfs.json" --tag "${tag}_${gpu}_shared_prefix_lpm_vs_fcfs" ;;
*)
    echo "usage: $0 qwen3-8b|qwen3-0.6b|shared OUT" >&2
    exit 2 ;;
esac
