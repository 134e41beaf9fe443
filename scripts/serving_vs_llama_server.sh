#!/usr/bin/env bash
# Side by side: the same serving workload (`kvserve bench --serving --url`) against llama.cpp's llama-server and
# against `kvserve serve`, one after the other, same model file, threads and concurrency. A benchmark, not a
# test: CI never calls it. Build llama.cpp first with ../shared/peers/llama-cpp.sh (it prints BIN_DIR).
#   scripts/serving_vs_llama_server.sh BIN_DIR [WORKLOAD FLAGS]
# Default workload: --requests 32 --concurrency 16 -p 512 -n 128 --seed 1 (all requests at once).
# Long prompts sharing prefixes (issue #34):
#   scripts/serving_vs_llama_server.sh BIN_DIR --requests 8 --concurrency 4 -p 4096 -n 128 --shared-prefix 4096 --prefix-groups 2
# Both servers get the same KV memory: llama-server's -c (every slot room for the shared prefix, a whole prompt
# and its output) and kvserve's --kv-mem of the same bytes (f16 K/V on both sides).
# Environment: MODEL (models/qwen2.5-coder-0.5b-instruct.gguf), THREADS (2), KVSERVE (./build/kvserve),
# KVSERVE_FIRST=1 runs kvserve first (to see what the order does), SERVE_ARGS (extra `kvserve serve` flags).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -lt 1 ] || [ ! -x "$1/llama-server" ]; then sed -n '2,8p' "$0" >&2; exit 2; fi
BIN=$1; shift
KVSERVE=${KVSERVE:-./build/kvserve}
MODEL=${MODEL:-models/qwen2.5-coder-0.5b-instruct.gguf}
THREADS=${THREADS:-2}
WORKLOAD=("$@")
[ ${#WORKLOAD[@]} -gt 0 ] || WORKLOAD=(--requests 32 --concurrency 16 -p 512 -n 128 --seed 1)
CONCURRENCY=16 PROMPT=512 OUTPUT=128 PREFIX=0
for ((i = 0; i < ${#WORKLOAD[@]} - 1; i++)); do
  case "${WORKLOAD[$i]}" in
    --concurrency) CONCURRENCY=${WORKLOAD[$((i + 1))]} ;;
    -p) PROMPT=${WORKLOAD[$((i + 1))]} ;;
    -n) OUTPUT=${WORKLOAD[$((i + 1))]} ;;
    --shared-prefix) PREFIX=${WORKLOAD[$((i + 1))]} ;;
  esac
done
PORT_LLAMA=${PORT_LLAMA:-18080} PORT_KVSERVE=${PORT_KVSERVE:-18081}
log=$(mktemp -d)
server=
trap '[ -z "$server" ] || kill -TERM $server 2>/dev/null || true; rm -rf "$log"' EXIT

# wait_ready URL PID: polls /health until it answers 200
wait_ready() {
  for _ in $(seq 1200); do
    curl -sf -o /dev/null "$1/health" && return 0
    kill -0 "$2" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}

# run_against NAME URL CMD...: starts the server CMD, drives the workload, stops it, prints peak RSS
run_against() {
  local name=$1 url=$2; shift 2
  echo "== $name: $* =="
  "$@" > "$log/$name.log" 2>&1 &
  server=$!
  wait_ready "$url" "$server" || { tail -20 "$log/$name.log" >&2; exit 1; }
  echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
  "$KVSERVE" bench --serving --url "$url" -m "$MODEL" "${WORKLOAD[@]}"
  echo "server peak RSS: $(awk '/^VmHWM/ {print $2 / 1024 " MiB"}' "/proc/$server/status")"
  kill -TERM "$server"; wait "$server" 2>/dev/null || true; server=
  echo
}

# Every slot gets room for a whole prompt and its output (llama-server splits -c evenly over its -np slots);
# kvserve's pool gets the bytes llama-server's f16 cache of CTX tokens takes.
CTX=$(( CONCURRENCY * (PREFIX + PROMPT + OUTPUT + 64) ))
KV_BYTES=$("$KVSERVE" kv-size "$MODEL" --ctx "$CTX" --kv-type f16 --json | sed -n 's/.*"bytes_per_token": \([0-9]*\).*/\1/p')
KV_MIB=$(( (CTX * KV_BYTES + (1 << 20) - 1) >> 20 ))
CTX_SEQ=$(( PREFIX + PROMPT + OUTPUT + 64 ))
llama() {
  run_against llama-server "http://127.0.0.1:$PORT_LLAMA" "$BIN/llama-server" -m "$MODEL" --port "$PORT_LLAMA" \
    -np "$CONCURRENCY" -c "$CTX" -fa on -t "$THREADS" -tb "$THREADS"
}
ours() {
  # shellcheck disable=SC2086 # SERVE_ARGS is a list of words
  run_against kvserve "http://127.0.0.1:$PORT_KVSERVE" "$KVSERVE" serve -m "$MODEL" --port "$PORT_KVSERVE" \
    --max-running "$CONCURRENCY" -t "$THREADS" -c "$CTX_SEQ" --kv-mem "$KV_MIB" ${SERVE_ARGS:-}
}
echo "- CPU: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) CPUs; model $MODEL; workload ${WORKLOAD[*]}"
echo "- KV memory on both sides: $CTX tokens of f16 K/V, $KV_MIB MiB (llama-server -c $CTX; kvserve --kv-mem $KV_MIB)"
if [ "${KVSERVE_FIRST:-0}" = 1 ]; then ours; llama; else llama; ours; fi
