# Stages of scripts/gpu_validate.sh: the kernels (the fused MoE's tests, counters and tiles;
# fla's autotuned choices; FlashInfer). Sourced by it, which sets py, out, stage, step,
# bench and the model paths:
#   scripts/gpu_validate.sh moe-tests  OUT  # the GPU tests of the MoE path alone (IEEE dots):
#                                           # gpt-oss's and Qwen3-MoE's parity, the MXFP4
#                                           # GEMMs, Gemma 4's experts, the router, PDL; after a
#                                           # change there, before families' whole list
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
#   scripts/gpu_validate.sh moe-gluon  OUT  # the fragment layout's Gluon GEMM
#                                           # (moe_mxfp4_gluon.py): its GPU tests, then its
#                                           # tiles and the Triton ones tuned at 1-256 and
#                                           # 8,192 tokens (copy OUT's mxfp4_gluon table into
#                                           # moe_configs; moe-tune-gluon: the other counts)
#   scripts/gpu_validate.sh moe-gluon-sweep OUT  # every Gluon tile against the Triton pick
#   scripts/gpu_validate.sh moe-ncu-gluon OUT  # Nsight Compute on the Gluon backend's picks at
#                                           # 16, 256 and 2,048 tokens (TOKENS), stall reasons;
#                                           # SOURCE=1: GEMM 1's stalls by instruction too
#   scripts/gpu_validate.sh moe-gluon-ab OUT  # gpt-oss-20b offline and batch 1: moe-words,
#                                           # moe-fragments and the default (Gluon on Hopper)
#   scripts/gpu_validate.sh moe-tk     OUT  # triton_kernels' matmul_ogs (carry its wheel in
#                                           # .whl) against the fused MXFP4 MoE, eager and
#                                           # graphed, at 1-4,096 tokens
#   scripts/gpu_validate.sh moe-fi     OUT  # FlashInfer's CUTLASS MoE (MXFP4 weights, bf16
#                                           # activations, Hopper) the same way; installs it
#                                           # as `fi` does (carry .whl-fi/1 with .whl). Its
#                                           # module builds first (~250 CUTLASS units: more
#                                           # than a call; again on the warm machine, ninja
#                                           # goes on from the units built)
#   scripts/gpu_validate.sh attn-wide  OUT  # decode attention at Gemma 4's heads (256 wide,
#                                           # 8 KV heads; 512 wide, 2) at 1-64 requests, with
#                                           # the launch sweep that sets _launch_config's rows
#                                           # and warps for heads wider than 128
#   scripts/gpu_validate.sh autotune-choices OUT  # the choices fla's autotuned kernels make
#                                           # for Qwen3.5-9B on this GPU (and the run's seconds
#                                           # on an empty cache, every kernel compiling on first
#                                           # use): copy OUT's JSON into
#                                           # python/minisgl/kernel/autotune_tables to ship them
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
moe-tests)
    xd=(); "$py" -c "import xdist" 2>/dev/null && xd=(-n 8 --dist loadfile)
    TRITON_F32_DEFAULT=ieee step 540 "$py" -m pytest -q -p no:cacheprovider -rf \
        -m "gpu or any_device" "${xd[@]}" --durations=10 tests/engine/test_gpt_oss.py \
        tests/kernels/test_mxfp4_moe.py tests/kernels/test_mxfp4_words.py \
        tests/kernels/test_gpt_oss_triton.py \
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
moe-tune)  # a budget that runs out keeps the shipped buckets of the counts it did not reach
    step 300 "$py" benchmark/kernels/tune_moe.py --mxfp4 --budget 260 --out "$out" \
        >"$out/tune_moe.log" 2>&1
    tail -3 "$out/tune_moe.log" ;;
moe-tune-gluon)  # the fragment layout's table with the Gluon kernel's tiles (LAYOUT=fragments:
    # the Triton tiles alone); OUT holds the table for moe_configs, TOKENS a part of the counts
    # (each call merges them into the table in moe_configs: copy OUT's there between calls),
    # BUDGET its seconds (500; less leaves time for another stage in the same call), NO_WS=1
    # without the warp-specialized tiles, SHORTLIST=1 the tiles other GPUs' tables pick alone
    step $((${BUDGET:-500} + 40)) "$py" benchmark/kernels/tune_moe.py --mxfp4 \
        --layout "${LAYOUT:-gluon}" --budget "${BUDGET:-500}" ${TOKENS:+--tokens $TOKENS} \
        ${NO_WS:+--no-ws} ${SHORTLIST:+--shortlist} --out "$out" >"$out/tune_moe.log" 2>&1
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
moe-fi)  # FlashInfer's CUTLASS MXFP4 MoE against the fused MoE (its JIT kernels compile first)
    fi_install
    step 560 "$py" benchmark/kernels/bench_moe_triton_kernels.py --library flashinfer \
        --out "$out" >"$out/bench_moe_flashinfer.log" 2>&1
    tail -4 "$out/bench_moe_flashinfer.log"; cat "$out"/*_moe_flashinfer_*.md ;;
moe-gluon)  # the Gluon GEMM: correct first, then the fragment layout's tiles and the Gluon
    # kernel's tuned at the offline benchmark's step sizes first (decode up to 256 requests, mixed
    # steps of 8,192 tokens; OUT holds the table for moe_configs; a budget cut short leaves the
    # larger batches to the built-in table): TOKENS="512 1024 4096" moe-tune-gluon adds a
    # server's chunks over it
    step 250 "$py" -m pytest -q -p no:cacheprovider -rf -m "gpu or any_device" \
        tests/kernels/test_mxfp4_fragments.py >"$out/gluon_tests.log" 2>&1
    tail -3 "$out/gluon_tests.log"
    step 290 "$py" benchmark/kernels/tune_moe.py --mxfp4 --layout gluon --budget 250 \
        --tokens ${TOKENS:-1 4 16 64 128 256 8192} --out "$out" >"$out/tune_moe.log" 2>&1
    tail -3 "$out/tune_moe.log" ;;
moe-ncu-gluon)  # the Gluon backend's picked tiles under Nsight Compute (its table in moe_configs;
    # CONFIG: one tile's MoeConfig fields as a tuple in place of the table's), with the L2's
    # traffic (an expert's row blocks each read its weights), issue and the ALU pipe
    ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | tail -1)
    step 400 "$ncu" --clock-control none --kernel-name regex:moe_gemm_mx_frag \
        --section SpeedOfLight --section Occupancy --section LaunchStats \
        --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis \
        --section InstructionStats --section ComputeWorkloadAnalysis \
        --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,\
dram__bytes_read.sum,lts__t_bytes.sum,lts__t_sectors_srcunit_tex_op_read_lookup_hit.sum" \
        "$py" benchmark/kernels/bench_moe_fragments.py --profile --gluon \
        ${CONFIG:+--config "$CONFIG"} \
        --tokens ${TOKENS:-16 256 2048} >"$out/ncu_moe_gluon.txt" 2>&1
    # the stall reasons of a warp an issued instruction, the larger ones (barrier, long and
    # short scoreboard, wait, math pipe throttle, ...)
    grep -E "moe_gemm_mx_frag|Duration|DRAM Throughput|L2 Cache Throughput|Achieved Occupancy|\
Issue Slots Busy|Registers Per|Waves Per SM|dram__bytes|lts__t_bytes|lookup_hit|highest-utilized|\
Executed Instructions  |stalled_[a-z_]+_per_issue_active.ratio +inst +([1-9]|0\.[1-9])" \
        "$out/ncu_moe_gluon.txt" | head -200
    if [ -n "${SOURCE:-}" ]; then  # GEMM 1 of the first token count's second call, by instruction
        t=${TOKENS:-16 256 2048}
        step 300 "$ncu" --clock-control none --kernel-name regex:moe_gemm_mx_frag \
            --launch-skip 2 --launch-count 1 --section SourceCounters --section WarpStateStats \
            -f -o "$out/ncu_source" "$py" benchmark/kernels/bench_moe_fragments.py --profile \
            --gluon ${CONFIG:+--config "$CONFIG"} --tokens "${t%% *}" >"$out/ncu_source.log" 2>&1
        "$ncu" -i "$out/ncu_source.ncu-rep" --page source --csv --print-source sass \
            >"$out/ncu_source.csv" 2>&1
        "$py" benchmark/kernels/ncu_source.py "$out/ncu_source.csv" --top 30 \
            | tee "$out/ncu_source.md"
    fi ;;
moe-gluon-sweep)  # every Gluon tile against the Triton table's pick, a table for the results
    step 330 "$py" benchmark/kernels/bench_moe_fragments.py --gluon-only \
        --tokens ${TOKENS:-256 128 64 1 16 2048} --out "$out" >"$out/bench_moe_gluon.log" 2>&1
    cat "$out"/moe_fragments_*.md ;;
moe-gluon-ab)  # the engine with the Gluon GEMM's table (the default on Hopper) against the word
    # layout and the fragment layout's Triton tiles (VARIANTS: fewer, e.g. moe-words,default)
    v=${VARIANTS:-moe-words,moe-fragments,default}
    step 330 "${bench[@]}" --model "$moss" --variants "$v" \
        --hf-requests 0 --tag gluon_ab >"$out/bench_gluon_ab.log" 2>&1
    step 200 "${bench[@]}" --model "$moss" --variants '' --batch1 \
        --batch1-variants "$v" --no-batch1-baseline --hf-requests 0 \
        --tag gluon_b1 >"$out/bench_gluon_b1.log" 2>&1
    head -12 "$out"/offline_gpt-oss-20b*gluon_ab.md "$out"/offline_gpt-oss-20b*gluon_b1.md ;;
moe-tk)  # triton_kernels' matmul_ogs against the fused MoE (its wheel for the installed Triton)
    step 300 "$py" benchmark/kernels/bench_moe_triton_kernels.py --out "$out" \
        >"$out/bench_moe_triton_kernels.log" 2>&1
    cat "$out"/*_moe_triton_kernels_*.md ;;
attn-wide)
    step 400 "$py" benchmark/kernels/bench_decode_attention.py --models Gemma-4-sliding \
        Gemma-4-global --batch 1 16 64 --ctx 1024 4096 --sweep --no-fi --out "$out" \
        >"$out/attn_wide.log" 2>&1
    grep "sweep best" "$out/attn_wide.log"; cat "$out"/*_decode_attention_*.md ;;
autotune-choices)  # needs fla-core (pip install 'minisgl[hybrid]'); on an empty kernel cache
    TRITON_CACHE_DIR=$(mktemp -d) step 500 "$py" benchmark/kernels/autotune_choices.py \
        --model benchmark/configs/qwen3.5-9b.json --out "$out" >"$out/autotune_choices.log" 2>&1
    tail -4 "$out/autotune_choices.log" ;;
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
esac
