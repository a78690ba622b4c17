#!/usr/bin/env bash
# Whose gaps are they at high concurrency, the client's or the server's? One server (random weights,
# its default options plus SERVER_ARGS) and the issue-15 workload at CONCURRENCY streams (128):
# first from one client process, with every process's CPU use sampled midway (OUT/top_<model>.txt);
# then from SPLIT (2) client processes at once, CONCURRENCY/SPLIT streams each. If the split clients
# see much smaller gaps at the same total load, the single client was the bottleneck.
#   benchmark/online/gpu_client_split.sh qwen3-0.6b OUT
set -euo pipefail
tag=$1 out=$2
here=$(cd "$(dirname "$0")" && pwd)
source "$here/gpu_common.sh"
conc=${CONCURRENCY:-128} split=${SPLIT:-2}
mkdir -p "$out"
model=$(mktemp -d)/$tag
"$py" "$here/dummy_model.py" "$here/../configs/$tag.json" "$model" >/dev/null
itl=(--dataset random --input-len 512,1024 --output-len 128,256 --rounds 4)
serve "${tag}_client_split"
bench "${itl[@]}" --concurrencies "$conc" --rounds 1 --seed 99 --out "$out/warmup" \
      --tag "${tag}_split_warmup" >/dev/null
bench "${itl[@]}" --concurrencies "$conc" --tag "${tag}_${gpu}_one_client" >"$out/one_client_$tag.log" &
client=$!
sleep 10
top -b -n 1 -w 200 | head -30 >"$out/top_$tag.txt"
wait "$client"
pids=()
for i in $(seq "$split"); do
    bench "${itl[@]}" --concurrencies $((conc / split)) --seed "$i" \
          --tag "${tag}_${gpu}_client${i}of${split}" >"$out/client${i}of${split}_$tag.log" &
    pids+=($!)
done
wait "${pids[@]}"
stop
grep -h "ITL" "$out/one_client_$tag.log" "$out"/client*of"${split}_$tag.log"
