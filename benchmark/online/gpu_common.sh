# Shared by gpu_suite.sh and gpu_itl.sh (sourced): the interpreter, port and GPU name, and a server
# on random weights started, benchmarked and stopped. The caller sets here, out, model and tag.
py=${PYTHON:-python3}
port=${PORT:-1919}
gpu=$("$py" -c "import torch; n = torch.cuda.get_device_name() if torch.cuda.is_available() else 'cpu'; print(next((k for k in ('H100', 'H200') if k in n), n))")

serve() {  # serve LOG_NAME [server args...]: start in the background, wait until healthy
           # (SERVER_ARGS: more server flags for every server of the run)
    local log="$out/server_$1.log"
    shift
    "$py" -m minisgl --model "$model" --served-model-name "$tag" --dummy-weights --port "$port" \
        ${SERVER_ARGS:-} "$@" >"$log" 2>&1 &
    server=$!
    for _ in $(seq 600); do
        curl -sf "http://127.0.0.1:$port/health" >/dev/null && return 0
        kill -0 "$server" 2>/dev/null || { tail -20 "$log"; return 1; }
        sleep 1
    done
    return 1
}
stop() { kill -TERM "$server"; wait "$server" || true; }
bench() { "$py" "$here/bench_serving.py" --base-url "http://127.0.0.1:$port" --out "$out" --no-progress "$@"; }
