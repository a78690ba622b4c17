#!/usr/bin/env bash
# The online benchmark suite on one GPU with random weights (the models of docs/performance.md):
#   1. random prompts at several Poisson request rates;
#   2. the shared-prefix workload with the radix cache, then with the naive cache, and their ratio.
# usage: benchmark/online/gpu_suite.sh CONFIG_JSON TAG RATES NUM_PROMPTS OUT_DIR [server args...]
#   e.g. benchmark/online/gpu_suite.sh benchmark/configs/qwen3-8b.json qwen3-8b 4,8,16,inf 200 out
set -euo pipefail
config=$1 tag=$2 rates=$3 num=$4 out=$5
shift 5
here=$(cd "$(dirname "$0")" && pwd)
source "$here/gpu_common.sh"
model=$(mktemp -d)/$tag
"$py" "$here/dummy_model.py" "$config" "$model" >/dev/null
mkdir -p "$out"

shared=(--dataset shared-prefix --groups 8 --per-group 32 --prefix-len 2048 --question-len 64
        --output-len 64 --request-rates inf)

serve "${tag}_radix" --cache radix "$@"
bench --dataset random --num-prompts "$num" --input-len 128,1024 --output-len 64,512 \
      --request-rates "$rates" --tag "${tag}_${gpu}_random_rates"
bench "${shared[@]}" --tag "${tag}_${gpu}_shared_prefix_radix"
curl -s "http://127.0.0.1:$port/metrics" >"$out/${tag}_${gpu}_metrics.txt"
stop
serve "${tag}_naive" --cache naive "$@"
bench "${shared[@]}" --tag "${tag}_${gpu}_shared_prefix_naive"
stop
bench --compare "$out/${tag}_${gpu}_shared_prefix_radix.json" "$out/${tag}_${gpu}_shared_prefix_naive.json" \
      --tag "${tag}_${gpu}_shared_prefix_radix_vs_naive"
tar -czf "$out/${tag}_${gpu}_online.tgz" -C "$out" --exclude='*.tgz' .  # one file to carry back
