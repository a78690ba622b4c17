# Stages of scripts/gpu_validate.sh: the models (every family's GPU parity; the figures of
# the large ones). Sourced by it, which sets py, out, stage, step, bench and the model paths:
#   scripts/gpu_validate.sh families   OUT  # GPU parity of every family on CUDA (float32, IEEE
#                                           # dots): dense, MoE, hybrid, gpt-oss (fp32 and
#                                           # MXFP4), Gemma 3/4, windows and sinks, the sliding
#                                           # pool, CUDA graphs; run it first after changing a
#                                           # model, a kernel or the engine. On a new machine
#                                           # (every kernel compiling) it takes longer than one
#                                           # call: PART=1, then PART=2 (half the files each)
#   scripts/gpu_validate.sh tests      OUT  # every test marked `gpu` (pytest -m gpu) on CUDA
#   scripts/gpu_validate.sh tp         OUT  # two GPUs: TP=2 against TP=1, TP tests, 8B/14B TP=1,2
#   scripts/gpu_validate.sh gpt-oss    OUT  # the MXFP4 MoE kernel and gpt-oss GPU tests
#                                           # (TESTS=0: none); gpt-oss-20b in MXFP4 (random
#                                           # weights) offline and batch 1, transformers (bf16)
#                                           # in the same run; gpt-oss-120b on one GPU, offline
#                                           # and batch 1
#   scripts/gpu_validate.sh gpt-oss-ab OUT  # gpt-oss-20b offline and batch 1, the fused MoE
#                                           # against --moe-backend triton_kernels (carry its
#                                           # wheel in .whl), same run
#   scripts/gpu_validate.sh gpt-oss-profile OUT  # where a gpt-oss-20b decode step's time goes,
#                                           # kernel by kernel: batch 1 and 64 (profile_decode.py
#                                           # --per-step; the MXFP4 MoE tiles' table as tuned);
#                                           # MODEL=gemma-4-26b-a4b BATCHES=64: another model's;
#                                           # VARIANT=moe-gluon: a bench.py variant's engine
#   scripts/gpu_validate.sh gemma      OUT  # window/sink kernels, Gemma 3/4 parity on CUDA
#                                           # (float32; the sliding pool under CUDA graphs and
#                                           # with radix hits; TESTS=0: none), Gemma 3 27B and
#                                           # Gemma 4 26B-A4B offline (random weights)
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
case $stage in
families)  # the tiny random models against CPU transformers in float32: Triton's fp32 dots
    # default to TF32 (10-bit mantissas), which flips near-tied greedy tokens and routes of
    # these models, so every dot here is IEEE; bf16 has tests of its own (test_gpu.py). The
    # reference is the installed transformers: use the version CI uses (older ones differ, e.g.
    # before 5.2x gpt-oss's experts ignore the config's swiglu_limit)
    xd=()  # test files in parallel when pytest-xdist is there (WORKERS=0: one process)
    "$py" -c "import xdist" 2>/dev/null && [ "${WORKERS:-8}" != 0 ] \
        && xd=(-n "${WORKERS:-8}" --dist loadfile)
    # a test stuck past 420 s fails with its stacks (pytest-timeout: the first hybrid test
    # compiles and autotunes fla's chunked kernels, past 300 s on an empty Triton cache with
    # eight workers), and past 450 s no worker starts another test, so pytest reaches its
    # summary (failures, durations) before the stage's own limit kills it; -v names every test
    # as it ends, in case it does not. PART=1, PART=2 split the list in about halves
    to=(); "$py" -c "import pytest_timeout" 2>/dev/null && to=(--timeout 420 --session-timeout 450)
    files=(tests/engine/test_parity.py tests/engine/test_gpu.py tests/engine/test_hybrid_parity.py
           tests/kernels/test_window_sinks.py
           tests/engine/test_gpt_oss.py tests/kernels/test_mxfp4_moe.py tests/kernels/test_mxfp4_words.py
           tests/kernels/test_gpt_oss_triton.py tests/kernels/test_moe_matmul_ogs.py
           tests/kernels/test_moe_libraries.py
           tests/engine/test_gemma_parity.py tests/kernels/test_norm_rope_gemma.py
           tests/kernels/test_gemma_moe.py tests/kernels/test_gemma_triton.py)
    case ${PART:-all} in  # about half the time each
        1) files=("${files[@]:0:4}") ;;
        2) files=("${files[@]:4}") ;;
    esac
    TRITON_F32_DEFAULT=ieee step 540 "$py" -m pytest -v -p no:cacheprovider -rfE \
        -m "gpu or any_device" "${xd[@]}" "${to[@]}" --durations=25 \
        "${files[@]}" >"$out/families_tests.log" 2>&1
    grep -E "(FAILED|ERROR) tests/" "$out/families_tests.log" | sort -u | head -30
    tail -28 "$out/families_tests.log" | grep -v " PASSED \| SKIPPED " ;;
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
gpt-oss-ab)  # the fused MoE against triton_kernels' matmul_ogs (its wheel in .whl), same run
    step 420 "${bench[@]}" --model $moss --variants default,triton-kernels --batch1 \
        --batch1-variants default,triton-kernels --no-batch1-baseline --hf-requests 0 \
        --tag moe_ab >"$out/bench_gpt-oss-20b_moe_ab.log" 2>&1
    cat "$out"/offline_gpt-oss-20b_*moe_ab.md ;;
gpt-oss-profile)  # MODEL: another config of benchmark/configs (e.g. gemma-4-26b-a4b)
    m=${MODEL:-gpt-oss-20b} v=${VARIANT:-default}
    for bs in ${BATCHES:-1 64}; do
        step 200 "$py" benchmark/offline/profile_decode.py --model "benchmark/configs/$m.json" \
            --batch $bs --tokens 32 --per-step --variant "$v" --out "$out" \
            >"$out/profile_${m}_${v}_bs$bs.log" 2>&1
        grep -A14 "per decode step" "$out/profile_${m}_${v}_bs$bs.log"
    done ;;
tests)
    "$py" -m pytest -q -p no:cacheprovider -rf -m gpu tests --durations=15 \
        >"$out/gpu_tests.log" 2>&1
    tail -3 "$out/gpu_tests.log" ;;
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
            tests/kernels/test_norm_rope_gemma.py \
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
hybrid-tests)  # fla-core must be importable (pip install 'minisgl[hybrid]'); float32 parity:
    # fla's chunked kernels take Triton's default fp32 dot (TF32) unless told otherwise, and a
    # TF32-rounded prefill flips near-tied MoE routes of the tiny random models
    TRITON_F32_DEFAULT=ieee step 500 "$py" -m pytest -q -p no:cacheprovider -rf \
        -m "gpu or any_device" tests/kernels/test_gated_delta_kernels.py \
        tests/kernels/test_hybrid_norm_kernels.py tests/kernels/test_gated_delta.py \
        tests/engine/test_hybrid_parity.py >"$out/hybrid_tests.log" 2>&1
    tail -5 "$out/hybrid_tests.log" ;;
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
esac
