#!/usr/bin/env bash
# Reproduce the GPU results, one stage at a time (each fits in about ten minutes on one H100/H200):
#   scripts/gpu_validate.sh tests   OUT   # the GPU tests (parity, fast paths, kernels) on CUDA;
#                                         # tests1 / tests2: one half each (ten minutes or less)
#   scripts/gpu_validate.sh offline OUT   # one-token GEMV vs cuBLAS; bench.py: Qwen3-0.6B with
#                                         # ablations, Qwen3-8B with batch 1 (GEMV and cuBLAS)
#   scripts/gpu_validate.sh sampling OUT  # sampling kernel tests and benchmark; bench.py sampling
#                                         # variants (Qwen3-0.6B, Qwen3-8B) next to greedy
#   scripts/gpu_validate.sh structured OUT  # bench.py Qwen3-0.6B, half the requests with a JSON
#                                           # schema, next to the same run without
#   scripts/gpu_validate.sh online  OUT   # the online suite: Qwen3-0.6B and Qwen3-8B, radix vs naive
#   scripts/gpu_validate.sh tp      OUT   # two GPUs: TP=2 feature by feature, TP tests, 8B/14B TP=1,2
#   scripts/gpu_validate.sh fp8     OUT   # FP8 tests; kernels vs _scaled_mm and bf16 (GEMM error,
#                                         # GEMV bandwidth); Qwen3-8B batch 1 and offline fp8 vs
#                                         # default; logits fp8 vs bf16; Qwen3-0.6B fp8-kv vs default
#   scripts/gpu_validate.sh itl     OUT   # streaming smoothness: mixed-batch attention kernels;
#                                         # prefill-first vs mixed steps (8B at concurrency 4/16/64,
#                                         # 0.6B at 128), one session per model
#   scripts/gpu_validate.sh itl-shared OUT  # lpm vs fcfs on the shared-prefix workload; offline
#                                           # bench.py default vs prefill-first
#   scripts/gpu_validate.sh recheck OUT   # the figures the open issues still need, in one call
#   scripts/gpu_validate.sh sweeps  OUT   # FP8 GEMV and FP8-KV attention block sizes; profiles
#   scripts/gpu_validate.sh final3  OUT   # sampler sizes, tests and kernel table; 0.6B log-probs;
#                                         # lpm vs fcfs
#   scripts/gpu_validate.sh steps   OUT   # the scheduler's own gaps between tokens (no server):
#                                         # Qwen3-8B at 64 streams, Qwen3-0.6B at 128, by budget
#   scripts/gpu_validate.sh pdl     OUT   # Qwen3-8B offline default vs fp8, batch 1 with PDL off
#                                         # and on (bf16, fp8); fp8 logits vs bf16; PDL, W8A16 tests
#   scripts/gpu_validate.sh w8a8    OUT   # the W8A8 GEMM's tests and kernel table; Qwen3-8B offline
#                                         # fp8 and fp8+fp8-kv vs default
#   scripts/gpu_validate.sh norm-gemv OUT  # one-token FP8 GEMVs with the norm and residual add
#                                          # inside (tests, Qwen3-8B batch 1 A/B); W8A8 table
#   scripts/gpu_validate.sh norm-quant OUT  # RMSNorms quantizing the FP8 QKV / gate-up inputs:
#                                           # Qwen3-8B offline default, fp8, fp8-no-norm-quant; tests
#   scripts/gpu_validate.sh quant   OUT   # per-token FP8 quantization in one pass vs two (kernel
#                                         # probe); Qwen3-8B offline default vs fp8; its tests
#   scripts/gpu_validate.sh attn    OUT   # decode attention longest first (probes: order, launch
#                                         # configs, read-only floor); Qwen3-8B default vs fp8,
#                                         # Qwen3-0.6B default vs fp8-kv; the attention tests
#   scripts/gpu_validate.sh overhead OUT  # batch 1: the engine's step against its CUDA graph
#                                         # replayed alone (0.6B, 8B fp8 and bf16); fp8 profile
#   scripts/gpu_validate.sh probe   OUT   # where the time goes: the sampler's sizes swept, batch-1
#                                         # FP8 profile; bench.py sample-logprobs, fp8-kv, fp8
#   scripts/gpu_validate.sh fp8-block OUT  # the FP8 checkpoints' block format in batches: tests,
#                                          # the paths' probe; Qwen3-8B default, fp8, fp8-block
# Logs and result files go to OUT; OUT.tgz packs them. PYTHON picks the interpreter (python3).
set -uo pipefail
stage=$1 out=$2
py=${PYTHON:-python3}
cd "$(dirname "$0")/.."
mkdir -p "$out"
export HF_HUB_OFFLINE=1 MINISGL_TEST_DEVICE=cuda
step() {  # step SECONDS CMD...: one step under a time limit, its wall time printed
    local limit=$1 t0=$SECONDS
    shift
    timeout -k 10 "$limit" "$@"
    local rc=$?
    echo "[$stage] ${*: -1} rc=$rc $((SECONDS - t0))s" >&2
}

case $stage in
tests|tests1|tests2)  # tests: both halves (about fifteen minutes); tests1, tests2: one each
    part1="tests/test_parity.py tests/test_gpu.py tests/test_mixed_schedule.py tests/test_piecewise.py
        tests/test_triton_attention.py"
    part2="tests/test_triton_kernels.py tests/test_decode_step_kernels.py tests/test_engine.py
        tests/test_sampling.py
        tests/test_sampling_kernel.py tests/test_penalties.py tests/test_fp8.py
        tests/test_fp8_kernels.py tests/test_fp8_w8a16.py tests/test_pdl.py"
    case $stage in tests1) files=$part1 ;; tests2) files=$part2 ;; *) files="$part1 $part2" ;; esac
    # shellcheck disable=SC2086  # the file lists split on whitespace
    "$py" -m pytest -q -p no:cacheprovider -rf $files --durations=15 >"$out/gpu_$stage.log" 2>&1
    tail -3 "$out/gpu_$stage.log" ;;
offline)
    "$py" benchmark/kernels/bench_gemv.py --out "$out" >"$out/bench_gemv.log" 2>&1
    "$py" benchmark/offline/bench.py --model benchmark/configs/qwen3-0.6b.json \
        --variants default,no-overlap,no-cuda-graph,torch-attn --hf-requests 64 --out "$out" \
        >"$out/bench_qwen3-0.6b.log" 2>&1
    "$py" benchmark/offline/bench.py --model benchmark/configs/qwen3-8b.json --batch1 \
        --hf-requests 32 --hf-batch 32 --out "$out" >"$out/bench_qwen3-8b.log" 2>&1
    cat "$out"/offline_*.md ;;
sampling)
    step 150 "$py" -m pytest -q -p no:cacheprovider -rf tests/test_sampling_kernel.py \
        tests/test_penalties.py tests/test_sampling.py >"$out/sampling_tests.log" 2>&1
    tail -3 "$out/sampling_tests.log"
    step 200 "$py" benchmark/offline/bench.py --model benchmark/configs/qwen3-0.6b.json --hf-requests 0 \
        --variants default,sample,sample-penalty,sample-logprobs,sample-torch --tag sampling \
        --out "$out" >"$out/bench_qwen3-0.6b_sampling.log" 2>&1
    grep -h "x of minisgl" "$out/bench_qwen3-0.6b_sampling.log"
    step 80 "$py" benchmark/kernels/bench_sampling.py --model benchmark/configs/qwen3-0.6b.json \
        --out "$out" >"$out/bench_sampling.log" 2>&1
    cat "$out"/*_sampling_*.md
    step 120 "$py" benchmark/offline/bench.py --model benchmark/configs/qwen3-8b.json --hf-requests 0 \
        --variants default,sample --tag sampling --out "$out" >"$out/bench_qwen3-8b_sampling.log" 2>&1
    grep -h "x of minisgl" "$out"/bench_*_sampling.log
    cat "$out"/offline_*_sampling.md ;;
structured)  # needs the default model's tokenizer (MINISGL_CACHE_DIR holding it is enough)
    step 200 "$py" benchmark/offline/bench.py --model benchmark/configs/qwen3-0.6b.json \
        --variants default --structured --hf-requests 0 --tag structured --out "$out" \
        >"$out/bench_qwen3-0.6b_structured.log" 2>&1
    cat "$out"/offline_*_structured.md ;;
online)
    PYTHON=$py benchmark/online/gpu_suite.sh benchmark/configs/qwen3-0.6b.json qwen3-0.6b \
        16,32,64,inf 200 "$out" >"$out/suite_qwen3-0.6b.log" 2>&1
    PYTHON=$py benchmark/online/gpu_suite.sh benchmark/configs/qwen3-8b.json qwen3-8b \
        4,8,16,inf 100 "$out" >"$out/suite_qwen3-8b.log" 2>&1
    grep -h "ratio\|TTFT (ms)\|output tok/s" "$out"/*radix_vs_naive.md ;;
tp)
    "$py" scripts/gpu_tp_check.py --out "$out/tp_check" | tee "$out/tp_check.txt"
    "$py" -m pytest -q -p no:cacheprovider -rf tests/test_tp.py >"$out/tp_tests.log" 2>&1
    tail -3 "$out/tp_tests.log"
    for m in qwen3-8b qwen3-14b; do
        "$py" benchmark/offline/bench.py --model "benchmark/configs/$m.json" --tp 1,2 \
            --hf-requests 0 --tag tp --out "$out" >"$out/bench_${m}_tp.log" 2>&1
    done
    cat "$out"/offline_*_tp.md ;;
fp8)
    step 150 "$py" -m pytest -q -p no:cacheprovider -rf tests/test_fp8.py tests/test_fp8_kernels.py \
        >"$out/fp8_tests.log" 2>&1
    tail -3 "$out/fp8_tests.log"
    step 120 "$py" benchmark/kernels/bench_fp8.py --out "$out" >"$out/bench_fp8.log" 2>&1
    step 220 "$py" benchmark/offline/bench.py --model benchmark/configs/qwen3-8b.json --hf-requests 0 \
        --variants default,fp8 --batch1 --batch1-variants default,fp8 --tag fp8 --out "$out" \
        >"$out/bench_qwen3-8b_fp8.log" 2>&1
    step 90 "$py" benchmark/offline/fp8_accuracy.py --model benchmark/configs/qwen3-8b.json \
        --variant fp8 --out "$out" >"$out/fp8_accuracy_qwen3-8b.log" 2>&1
    step 90 "$py" benchmark/offline/bench.py --model benchmark/configs/qwen3-0.6b.json \
        --hf-requests 0 --variants default,fp8-kv --tag fp8 --out "$out" \
        >"$out/bench_qwen3-0.6b_fp8.log" 2>&1
    tail -n 30 "$out/bench_fp8.log"
    cat "$out"/*_fp8_*.md "$out"/fp8_accuracy_*.json ;;
itl)
    step 60 "$py" benchmark/kernels/bench_mixed_attention.py >"$out/bench_mixed_attention.log" 2>&1
    PYTHON=$py step 330 benchmark/online/gpu_itl.sh qwen3-8b "$out" >"$out/itl_qwen3-8b.log" 2>&1
    PYTHON=$py step 170 benchmark/online/gpu_itl.sh qwen3-0.6b "$out" >"$out/itl_qwen3-0.6b.log" 2>&1
    cat "$out/bench_mixed_attention.log" "$out"/*_itl.md ;;
itl-shared)
    PYTHON=$py benchmark/online/gpu_itl.sh shared "$out" >"$out/itl_shared.log" 2>&1
    "$py" benchmark/offline/bench.py --model benchmark/configs/qwen3-0.6b.json \
        --variants default,prefill-first --hf-requests 0 --tag sched --out "$out" \
        >"$out/bench_qwen3-0.6b_sched.log" 2>&1
    cat "$out"/*lpm_vs_fcfs.md "$out"/offline_*sched.md ;;
recheck)  # about nine minutes: what the open issues still need after the 2026-11-23 runs
    m06=benchmark/configs/qwen3-0.6b.json m8=benchmark/configs/qwen3-8b.json
    step 130 "$py" benchmark/offline/bench.py --model $m06 --hf-requests 0 --tag recheck \
        --variants default,sample,sample-penalty,sample-logprobs --out "$out" \
        >"$out/bench_qwen3-0.6b_recheck.log" 2>&1
    grep -h "x of minisgl" "$out/bench_qwen3-0.6b_recheck.log"
    step 90 "$py" -m pytest -q -p no:cacheprovider -rf tests/test_sampling_kernel.py \
        tests/test_fp8.py tests/test_fp8_kernels.py >"$out/gpu_tests.log" 2>&1
    tail -2 "$out/gpu_tests.log"
    step 60 "$py" benchmark/kernels/bench_sampling.py --out "$out" >"$out/bench_sampling.log" 2>&1
    grep "151,936 | 256" "$out"/*_sampling_*.md
    step 40 "$py" benchmark/kernels/bench_fp8.py --out "$out" >"$out/bench_fp8.log" 2>&1
    step 150 "$py" benchmark/offline/bench.py --model $m8 --hf-requests 0 --variants default,fp8 \
        --batch1 --batch1-variants fp8 --tag fp8 --out "$out" >"$out/bench_qwen3-8b_fp8.log" 2>&1
    grep -h "x of minisgl\|batch1" "$out"/offline_qwen3-8b_*fp8.md
    step 60 "$py" benchmark/offline/fp8_accuracy.py --model $m8 --variant fp8 --out "$out" \
        >"$out/fp8_accuracy.log" 2>&1
    tail -n 3 "$out/fp8_accuracy.log"
    PYTHON=$py step 150 benchmark/online/gpu_itl.sh shared "$out" >"$out/itl_shared.log" 2>&1
    cat "$out"/*lpm_vs_fcfs.md ;;
probe)  # about nine minutes
    m06=benchmark/configs/qwen3-0.6b.json m8=benchmark/configs/qwen3-8b.json
    step 110 "$py" benchmark/kernels/bench_sampling.py --sweep --out "$out" >"$out/sweep.log" 2>&1
    grep -h '"sizes": "default"\|argmax' "$out/sweep.log" | cut -c1-400
    step 130 "$py" benchmark/offline/bench.py --model $m06 --hf-requests 0 --tag probe \
        --variants default,sample-logprobs,fp8-kv --out "$out" >"$out/bench_qwen3-0.6b_probe.log" 2>&1
    grep -h "x of minisgl" "$out/bench_qwen3-0.6b_probe.log"
    step 170 "$py" benchmark/offline/bench.py --model $m8 --hf-requests 0 --variants default,fp8 \
        --batch1 --batch1-variants fp8 --tag fp8 --out "$out" >"$out/bench_qwen3-8b_fp8.log" 2>&1
    grep -h "x of minisgl\|batch1" "$out"/offline_qwen3-8b_*fp8.md
    step 60 "$py" benchmark/offline/profile_decode.py --model $m8 --quantization fp8 --out "$out" \
        >"$out/profile_fp8.log" 2>&1
    head -n 16 "$out/profile_fp8.log" | cut -c1-60,100-150
    step 45 "$py" benchmark/kernels/bench_fp8.py --out "$out" >"$out/bench_fp8.log" 2>&1
    tail -n 14 "$out/bench_fp8.log" ;;
final3)  # about nine minutes: chunks per collect program; the sampler's tests and kernel
    # benchmark; Qwen3-0.6B sample-logprobs; lpm against fcfs
    m06=benchmark/configs/qwen3-0.6b.json
    step 90 "$py" benchmark/kernels/bench_sampling.py --sweep --out "$out" >"$out/sweep.log" 2>&1
    grep -h '"sizes"\|argmax' "$out/sweep.log" | cut -c1-250
    step 80 "$py" -m pytest -q -p no:cacheprovider -rf tests/test_sampling_kernel.py \
        >"$out/sampling_tests.log" 2>&1
    tail -2 "$out/sampling_tests.log"
    step 100 "$py" benchmark/offline/bench.py --model $m06 --hf-requests 0 --tag final3 \
        --variants default,sample-logprobs --out "$out" >"$out/bench_qwen3-0.6b.log" 2>&1
    grep -h "x of minisgl" "$out/bench_qwen3-0.6b.log"
    step 130 "$py" benchmark/kernels/bench_sampling.py --out "$out" >"$out/bench_sampling.log" 2>&1
    grep "151,936 | 256\|32,000 | 256" "$out"/*_sampling_H*.md
    PYTHON=$py step 140 benchmark/online/gpu_itl.sh shared "$out" >"$out/itl_shared.log" 2>&1
    cat "$out"/*lpm_vs_fcfs.md ;;
sweeps)  # about four minutes: block sizes of the FP8 GEMV and the FP8-KV decode attention;
    # where the time of a batch-256 decode step with log-probs goes
    step 100 "$py" benchmark/kernels/bench_fp8.py --sweep --gemv-only --out "$out" \
        >"$out/bench_fp8_sweep.log" 2>&1
    grep -o '"layer": "[a-z_]*"\|"best_config": [^]]*]\|"best_tb_s": [0-9.]*\|"channel_us": [0-9.]*' \
        "$out/bench_fp8_sweep.log" | paste -sd' ' | sed 's/"layer"/\n&/g'
    step 80 "$py" benchmark/kernels/bench_decode_attention.py --kv-dtype fp8 --batch 64 256 \
        --ctx 1024 --sweep --out "$out" >"$out/bench_attn_fp8.log" 2>&1
    grep -h "sweep best\|^| Qwen" "$out/bench_attn_fp8.log"
    for v in sample sample-logprobs; do
        step 50 "$py" benchmark/offline/profile_decode.py --model benchmark/configs/qwen3-0.6b.json \
            --batch 256 --variant $v --out "$out" >"$out/profile_$v.log" 2>&1
        grep "ms per step" "$out/profile_$v.log"
    done ;;
steps)  # about six minutes; MODES8 and MODES06 pick the schedule modes, PROFILE=N profiles N steps
    step 330 "$py" benchmark/online/step_streams.py --model benchmark/configs/qwen3-8b.json \
        --concurrency 64 ${PROFILE:+--profile $PROFILE} --modes "${MODES8:-prefill-first,mixed-256,mixed-512,mixed-1024,mixed-2048}" \
        --out "$out" >"$out/steps_qwen3-8b.log" 2>&1
    step 200 "$py" benchmark/online/step_streams.py --model benchmark/configs/qwen3-0.6b.json \
        --concurrency 128 ${PROFILE:+--profile $PROFILE} --modes "${MODES06:-prefill-first,mixed,mixed-2048}" --out "$out" \
        >"$out/steps_qwen3-0.6b.log" 2>&1
    cat "$out"/steps_*.md ;;
pdl)  # about nine minutes
    step 330 "$py" benchmark/offline/bench.py --model benchmark/configs/qwen3-8b.json --hf-requests 0 \
        --variants default,fp8 --batch1 --batch1-variants no-pdl,fp8,fp8-no-pdl --tag pdl \
        --out "$out" >"$out/bench_pdl.log" 2>&1
    cat "$out"/offline_*_pdl.md
    step 90 "$py" benchmark/offline/fp8_accuracy.py --model benchmark/configs/qwen3-8b.json \
        --variant fp8 --out "$out" >"$out/fp8_accuracy_qwen3-8b.log" 2>&1
    cat "$out"/fp8_accuracy_*.json
    step 120 "$py" -m pytest -q -p no:cacheprovider -rf tests/test_pdl.py tests/test_fp8_w8a16.py \
        >"$out/gpu_tests.log" 2>&1
    tail -3 "$out/gpu_tests.log" ;;
w8a8)  # about six minutes
    step 170 "$py" -m pytest -q -p no:cacheprovider -rf tests/test_fp8_w8a16.py \
        tests/test_fp8_kernels.py -k "w8a8 or fp8_linear or pick_config" \
        >"$out/gpu_tests_w8a8.log" 2>&1
    tail -3 "$out/gpu_tests_w8a8.log"
    step 90 "$py" benchmark/kernels/bench_fp8_small.py --out "$out" >"$out/bench_fp8_small.log" 2>&1
    step 330 "$py" benchmark/offline/bench.py --model benchmark/configs/qwen3-8b.json --hf-requests 0 \
        --variants default,fp8,fp8+fp8-kv --tag w8a8 --out "$out" >"$out/bench_w8a8.log" 2>&1
    cat "$out"/offline_*_w8a8.md ;;
fp8-block)  # about seven minutes
    step 260 "$py" -m pytest -q -p no:cacheprovider -rf tests/test_fp8_w8a16.py \
        tests/test_fp8_kernels.py tests/test_fp8.py >"$out/gpu_tests_fp8.log" 2>&1
    tail -3 "$out/gpu_tests_fp8.log"
    step 120 "$py" benchmark/results/s20_2026-11-26/probe_block_paths.py "$out" \
        >"$out/probe_block_paths.log" 2>&1
    step 240 "$py" benchmark/offline/bench.py --model benchmark/configs/qwen3-8b.json \
        --hf-requests 0 --variants default,fp8,fp8-block --batch1 --batch1-variants fp8,fp8-block --tag fp8-block \
        --out "$out" >"$out/bench_fp8_block.log" 2>&1
    cat "$out"/offline_*_fp8-block.md ;;
norm-gemv)  # about seven minutes
    step 240 "$py" -m pytest -q -p no:cacheprovider -rf tests/test_fp8_kernels.py \
        tests/test_fp8_w8a16.py tests/test_fp8.py \
        -k "gemv or w8a8 or fp8_linear or pick_config or gpu_fp8 or one_token or compile" \
        >"$out/gpu_tests_norm_gemv.log" 2>&1
    tail -3 "$out/gpu_tests_norm_gemv.log"
    step 260 "$py" benchmark/offline/bench.py --model benchmark/configs/qwen3-8b.json --hf-requests 0 \
        --variants '' --batch1 --batch1-variants fp8,fp8-no-norm-gemv,fp8,fp8-no-norm-gemv \
        --tag norm_gemv --out "$out" >"$out/bench_norm_gemv.log" 2>&1
    cat "$out"/offline_*_norm_gemv.md
    step 90 "$py" benchmark/kernels/bench_fp8_small.py --out "$out" >"$out/bench_fp8_small.log" 2>&1 ;;
norm-quant)  # about nine minutes
    step 420 "$py" benchmark/offline/bench.py --model benchmark/configs/qwen3-8b.json --hf-requests 0 \
        --variants default,fp8,fp8-no-norm-quant --tag norm_quant --out "$out" \
        >"$out/bench_norm_quant.log" 2>&1
    cat "$out"/offline_*_norm_quant.md
    step 150 "$py" -m pytest -q -p no:cacheprovider -rf tests/test_fp8.py tests/test_fp8_kernels.py \
        -k "gpu or norm or quant" >"$out/gpu_tests_norm_quant.log" 2>&1
    tail -3 "$out/gpu_tests_norm_quant.log" ;;
quant)  # about six minutes
    step 120 env OUT="$out" "$py" benchmark/results/s13_2026-11-24/probe_quant_one_pass.py \
        >"$out/probe_quant_one_pass.log" 2>&1
    tail -10 "$out/probe_quant_one_pass.log"
    step 250 "$py" benchmark/offline/bench.py --model benchmark/configs/qwen3-8b.json --hf-requests 0 \
        --variants default,fp8 --tag quant --out "$out" >"$out/bench_quant.log" 2>&1
    cat "$out"/offline_*_quant.md
    step 100 "$py" -m pytest -q -p no:cacheprovider -rf tests/test_fp8_kernels.py \
        tests/test_fp8_w8a16.py -k "quant or w8a8" >"$out/gpu_tests_quant.log" 2>&1
    tail -3 "$out/gpu_tests_quant.log" ;;
attn)  # about eight minutes
    for p in lpt cfg readonly; do
        step 150 "$py" benchmark/results/s14_2026-11-24/probe_attn_$p.py "$out/probe_attn_$p.json" \
            >"$out/probe_attn_$p.log" 2>&1
        tail -6 "$out/probe_attn_$p.log"
    done
    step 250 "$py" benchmark/offline/bench.py --model benchmark/configs/qwen3-8b.json --hf-requests 0 \
        --variants default,fp8 --tag attn --out "$out" >"$out/bench_qwen3-8b_attn.log" 2>&1
    step 200 "$py" benchmark/offline/bench.py --model benchmark/configs/qwen3-0.6b.json \
        --hf-requests 0 --variants default,fp8-kv --tag attn --out "$out" \
        >"$out/bench_qwen3-0.6b_attn.log" 2>&1
    cat "$out"/offline_*_attn.md
    step 150 "$py" -m pytest -q -p no:cacheprovider -rf tests/test_triton_attention.py \
        tests/test_fp8_kernels.py -k "decode or backend or graph" >"$out/gpu_tests_attn.log" 2>&1
    tail -3 "$out/gpu_tests_attn.log" ;;
overhead)  # about five minutes
    m8=benchmark/configs/qwen3-8b.json
    step 150 "$py" benchmark/results/s17_2026-11-25/probe_step_overhead.py \
        benchmark/configs/qwen3-0.6b.json default >"$out/step_overhead.log" 2>&1
    step 200 "$py" benchmark/results/s17_2026-11-25/probe_step_overhead.py $m8 fp8 default \
        >>"$out/step_overhead.log" 2>&1
    grep -h '^{' "$out/step_overhead.log"
    step 90 "$py" benchmark/offline/profile_decode.py --model $m8 --quantization fp8 --tokens 129 \
        --per-step --out "$out" >"$out/profile_bs1_fp8.log" 2>&1
    grep -h "per decode step\|GPU idle" "$out/profile_bs1_fp8.log" ;;
*)
    echo "usage: $0 tests|tests1|tests2|offline|sampling|structured|online|tp|fp8|itl|itl-shared|recheck|steps|pdl|w8a8|norm-gemv|norm-quant|quant|attn|overhead|probe|sweeps|final3 OUT" >&2
    exit 2 ;;
esac
tar -czf "$out.tgz" -C "$(dirname "$out")" "$(basename "$out")"
