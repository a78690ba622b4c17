#!/usr/bin/env bash
# The scheduler's redesign (typed step plans, speculation through a few entry points, a cache
# coordinator) against the tree before it, on one GPU: "no slower" is this table.
#
#   scripts/gpu_kitchen.sh OUT STAGE [OLD_REV]
#
# Each stage fits one 10-minute device call; run them into the same OUT and the table grows:
#   offline    bench.py: Qwen3-8B (256 requests, random weights) and its batch-1 latency,
#              Qwen3.5-9B (needs fla-core) offline
#   spec-cost  bench_spec.py on Qwen3-8B (random weights): a step verifying k = 1..8 drafts
#              against a plain decode step, batch 1 and 64 (--verify-cost), and a batch-1 step
#              drafting k tokens with a random EAGLE-3 head (--eagle3-cost: the target eager
#              before the redesign, under the decode graphs after it); each tree twice, in the
#              order old, new, new, old
#   workloads  bench_spec.py: code editing and chat, none / ngram / suffix, batch 1 and 64, on the
#              default model (SmolLM2-135M: its weights must be in MINISGL_CACHE_DIR); 512 new
#              tokens and the median of 5 runs a shape (a batch-64 run of 256 tokens lasts 0.3-0.5 s
#              and varied by 30% within one tree)
#   mtp-cost   bench_spec.py --mtp-cost on Qwen3.5-9B (random weights): a batch-1 step drafting k
#              tokens with the model's MTP head (eager, decode graphs off, before the redesign;
#              the head's graphs and the decode graphs after it), old, new, new, old
#   ab         the workloads' batch-1 comparison with both trees timed in the same minutes
#              (benchmark/offline/spec_ab.py: one engine a tree in a process of its own, the same
#              prompts' token ids sent to both, runs alternating; "workloads" runs each tree's own
#              prompt files, which differ between revisions, one tree after the other)
# The old tree is OLD_TREE (a directory holding the old revision's python/ and benchmark/, for a
# machine whose git lacks it: `mkdir -p .kitchen-old && git archive REV python benchmark |
# tar -x -C .kitchen-old`, then carry .kitchen-old), else a git worktree of OLD_REV (default: the
# commit before the redesign's first, found by its message). Both trees run the same workloads,
# alternating (old, new, old, new where a stage repeats) so that a drifting clock hurts neither;
# each tree's results go to OUT/old and OUT/new, the side-by-side table to OUT/kitchen.md.
# PYTHON picks the interpreter (python3).
set -uo pipefail
out=$1 stage=${2:-}
py=${PYTHON:-python3}
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
mkdir -p "$out/old" "$out/new"
out=$(cd "$out" && pwd)
if [ -n "${OLD_TREE:-}" ]; then
    tree=$(cd "$OLD_TREE" && pwd)
else
    first=$(git log --format=%H --grep='^Scheduler tests on CPU with a scripted target' | tail -1)
    old=${3:-${first:+$first^}}
    if [ -z "$old" ]; then
        echo "gpu_kitchen: give the old tree: OLD_TREE=DIR, or $0 OUT STAGE REV" >&2
        exit 2
    fi
    tree=$(mktemp -d /tmp/minisgl-kitchen-old.XXXX)
    git worktree add --detach --force "$tree" "$old" >/dev/null || exit 1
    trap 'git -C "$root" worktree remove --force "$tree"' EXIT
fi
export HF_HUB_OFFLINE=1
m8=benchmark/configs/qwen3-8b.json m9=benchmark/configs/qwen3.5-9b.json

run() {  # run SECONDS OLD|NEW LOG CMD...: one benchmark of one tree, its wall time printed
    local limit=$1 tag=$2 log=$3 t0=$SECONDS
    shift 3
    local dir=$([ "$tag" = old ] && echo "$tree" || echo "$root")
    (cd "$dir" && PYTHONPATH="$dir/python${PYTHONPATH:+:$PYTHONPATH}" timeout -k 10 "$limit" "$py" "$@" \
        --out "$out/$tag" >>"$out/$tag/$log" 2>&1)
    echo "[kitchen] $tag $log rc=$? $((SECONDS - t0))s" >&2
}

case $stage in
offline)
    for tag in old new; do
        run 150 $tag bench_qwen3-8b.log benchmark/offline/bench.py --model $m8 --batch1 \
            --no-batch1-baseline --hf-requests 0
    done
    for tag in old new; do
        run 120 $tag bench_qwen3.5-9b.log benchmark/offline/bench.py --model $m9 \
            --hf-requests 0
    done ;;
spec-cost)  # old, new, new, old: the second run of a call ran 3-6% faster (the best of two kept)
    pass=0
    for tag in old new new old; do
        pass=$((pass + 1))
        run 150 $tag verify_cost.log benchmark/offline/bench_spec.py --model $m8 --verify-cost \
            --batch 64 --tag verify_cost_$pass
        run 100 $tag eagle3_cost.log benchmark/offline/bench_spec.py --model $m8 --eagle3-cost \
            --tag eagle3_cost_$pass
    done ;;
mtp-cost)  # --mtp-cost on Qwen3.5-9B (random weights, needs fla-core): this tree's script on
    # both (the old one has no --mtp-cost; the script runs on the old package), old, new, new, old
    pass=0
    for tag in old new new old; do
        pass=$((pass + 1))
        MINISGL_COMMIT=$([ $tag = old ] && echo "${OLD_NAME:-old tree}" || echo "${MINISGL_COMMIT:-}") \
            run 140 $tag mtp_cost.log "$root/benchmark/offline/bench_spec.py" --model $m9 \
            --mtp-cost --tag mtp_cost_$pass
    done ;;
workloads)
    for pass in 1 2; do
        for tag in old new; do
            run 600 $tag bench_spec.log benchmark/offline/bench_spec.py --batch 64 \
                --methods none,ngram,suffix --workloads code,chat --max-tokens 512 \
                --repeats 5 --tag workloads_$pass
        done
    done ;;
ab)  # the workloads with both trees in the same minutes, run by run (spec_ab.py: one engine a
    # tree, the same prompts' token ids, alternating): batch BATCH (default 1), on MODEL (default:
    # the default model, whose GGUF is 98 MB to carry)
    t0=$SECONDS
    # MODEL=DIR DUMMY=1: random weights on the config and tokenizer in DIR (spec_ab.py
    # --save-config DIR on a machine with the default model): no weights to carry
    timeout -k 10 560 "$py" benchmark/offline/spec_ab.py --old-tree "$tree" --out "$out" \
        --batch "${BATCH:-1}" ${MODEL:+--model "$MODEL"} ${DUMMY:+--dummy-weights} \
        >"$out/spec_ab_batch${BATCH:-1}.log" 2>&1
    echo "[kitchen] ab rc=$? $((SECONDS - t0))s" >&2
    cat "$out/spec_ab_batch${BATCH:-1}.md"
    exit 0 ;;
*)
    echo "gpu_kitchen: STAGE is offline, spec-cost, mtp-cost, workloads or ab" >&2
    exit 2 ;;
esac
"$py" scripts/kitchen_compare.py "$out/old" "$out/new" | tee "$out/kitchen.md"
