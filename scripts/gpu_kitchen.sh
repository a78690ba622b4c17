#!/usr/bin/env bash
# The scheduler's redesign (typed step plans, speculation through a few entry points, a cache
# coordinator) against the tree before it, on one GPU, in one call: "no slower" is this table.
#
#   scripts/gpu_kitchen.sh OUT [OLD_REV]
#
# Both trees run the same workloads, the old one from a git worktree of OLD_REV (default: the
# commit before the redesign's first, found by its message), the new one from this checkout:
#   - bench_spec.py: code editing and chat, none / ngram / suffix, batch 1 and 64 (the default
#     model, SmolLM2-135M), tok/s and acceptance;
#   - bench.py: Qwen3-8B offline (256 requests, random weights) and its batch-1 latency.
# The trees alternate (old, new, old, new) so that a drifting clock hurts neither. Each tree's
# results go to OUT/old and OUT/new, the side-by-side table to OUT/kitchen.md; OUT.tgz packs OUT.
# About 25 minutes on an H100 or H200. PYTHON picks the interpreter (python3).
set -uo pipefail
out=$1
py=${PYTHON:-python3}
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
first=$(git log --format=%H --grep='^Scheduler tests on CPU with a scripted target' | tail -1)
old=${2:-${first:+$first^}}
if [ -z "$old" ]; then
    echo "gpu_kitchen: give the revision before the redesign: $0 OUT REV" >&2
    exit 2
fi
mkdir -p "$out/old" "$out/new"
out=$(cd "$out" && pwd)
tree=$(mktemp -d /tmp/minisgl-kitchen-old.XXXX)
git worktree add --detach --force "$tree" "$old" >/dev/null || exit 1
trap 'git -C "$root" worktree remove --force "$tree"' EXIT
export HF_HUB_OFFLINE=1
m8=benchmark/configs/qwen3-8b.json

run() {  # run SECONDS TREE OLD|NEW LOG CMD...: one benchmark of one tree, its wall time printed
    local limit=$1 dir=$2 tag=$3 log=$4 t0=$SECONDS
    shift 4
    (cd "$dir" && PYTHONPATH="$dir/python" timeout -k 10 "$limit" "$py" "$@" \
        --out "$out/$tag" >>"$out/$tag/$log" 2>&1)
    echo "[kitchen] $tag $log rc=$? $((SECONDS - t0))s" >&2
}

for pass in 1 2; do  # the same benchmark on both trees back to back, twice
    for tag in old new; do
        dir=$([ $tag = old ] && echo "$tree" || echo "$root")
        run 600 "$dir" $tag bench_spec.log benchmark/offline/bench_spec.py --batch 64 \
            --methods none,ngram,suffix --workloads code,chat --max-tokens 256 \
            --tag workloads_$pass
    done
done
for tag in old new; do
    dir=$([ $tag = old ] && echo "$tree" || echo "$root")
    run 900 "$dir" $tag bench_qwen3-8b.log benchmark/offline/bench.py --model $m8 --batch1 \
        --no-batch1-baseline --hf-requests 0
done
"$py" scripts/kitchen_compare.py "$out/old" "$out/new" | tee "$out/kitchen.md"
tar -czf "$out.tgz" -C "$(dirname "$out")" "$(basename "$out")"
