#!/usr/bin/env bash
# The same serving workload through `kvserve serve` over HTTP (`bench --serving
# --url`) and through the in-process engine (`bench --serving`), back to back,
# so that both see the same machine load. Extra arguments replace the workload.
#   scripts/serving_compare.sh [--requests 32 --concurrency 8 -p 128 -n 64]
# ENGINE_FIRST=1 runs the in-process benchmark first (to see what the order does).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-./build/kvserve}
MODEL=${MODEL:-models/smollm2-135m-instruct-q4_1.gguf}
THREADS=${THREADS:-1}
WORKLOAD=("$@")
[ ${#WORKLOAD[@]} -gt 0 ] || WORKLOAD=(--requests 32 --concurrency 8 -p 128 -n 64 --seed 1)
CONCURRENCY=8
for ((i = 0; i < ${#WORKLOAD[@]} - 1; i++)); do
  [ "${WORKLOAD[$i]}" = --concurrency ] && CONCURRENCY=${WORKLOAD[$((i + 1))]}
done

log=$(mktemp)
"$BIN" serve -m "$MODEL" --port 0 --max-running "$CONCURRENCY" -t "$THREADS" 2>"$log" &
server=$!
trap 'kill -TERM $server 2>/dev/null || true; rm -f "$log"' EXIT
for _ in $(seq 600); do
  port=$(grep -o 'http://127.0.0.1:[0-9]*' "$log" | head -1 | sed 's/.*://') || true
  [ -n "$port" ] && break
  kill -0 $server 2>/dev/null || { cat "$log" >&2; exit 1; }
  sleep 0.1
done
[ -n "$port" ] || { echo "the server did not start" >&2; exit 1; }

in_process() {
  echo "== in-process engine, -t $THREADS =="
  "$BIN" bench --serving -m "$MODEL" -t "$THREADS" "${WORKLOAD[@]}"
  echo
}

echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
[ "${ENGINE_FIRST:-0}" = 1 ] && in_process
echo "== kvserve serve -t $THREADS --max-running $CONCURRENCY, driven over HTTP =="
"$BIN" bench --serving --url "http://127.0.0.1:$port" -m "$MODEL" "${WORKLOAD[@]}"
kill -TERM $server
wait $server || true
echo
[ "${ENGINE_FIRST:-0}" = 1 ] || in_process
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
