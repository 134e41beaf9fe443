#!/usr/bin/env bash
# The router's policies compared on one shared-prefix workload (docs/scaling.md): for each policy,
# scripts/cluster.sh starts fresh replicas + the router, `kvserve bench --serving --url ROUTER`
# replays the workload through it, and each replica's /metrics gives what it did: requests, prompt
# tokens computed, prefix-cache hit tokens. Counted work does not depend on the host's load; the
# wall-clock columns do (on a 2-core host, N replicas share 2 cores: no scale-out to read there).
#
# Usage: scripts/cluster_bench.sh [-m MODEL] [-n REPLICAS] [--policies "round_robin cache_aware"] [BENCH_FLAGS...]
# BENCH_FLAGS default to: --requests 48 --concurrency 6 -p 48 -n 16 --shared-prefix 192 --prefix-groups 6 --seed 1
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
model=$root/models/smollm2-135m-instruct-q4_1.gguf
replicas=3
policies="round_robin cache_aware"
bin=$root/build/kvserve
while [ $# -gt 0 ]; do
  case $1 in
    -m) model=$2; shift 2 ;;
    -n) replicas=$2; shift 2 ;;
    --policies) policies=$2; shift 2 ;;
    *) break ;;
  esac
done
bench_flags=("$@")
[ ${#bench_flags[@]} -gt 0 ] ||
  bench_flags=(--requests 48 --concurrency 6 -p 48 -n 16 --shared-prefix 192 --prefix-groups 6 --seed 1)

cluster_pid=""
trap '[ -n "$cluster_pid" ] && kill -TERM "$cluster_pid" 2>/dev/null && wait "$cluster_pid" 2>/dev/null' EXIT

metric() {  # metric URL NAME: the sample's value (0 if absent)
  curl -s -m 10 "$1/metrics" | awk -v n="$2" '$1 == n { print $2; found = 1 } END { if (!found) print 0 }'
}

summary=$(mktemp)
for policy in $policies; do
  out=$(mktemp)
  "$root/scripts/cluster.sh" -n "$replicas" -m "$model" --port 0 --policy "$policy" --kvserve "$bin" >"$out" 2>&1 &
  cluster_pid=$!
  for _ in $(seq 1200); do grep -q '^ready: ' "$out" && break; kill -0 "$cluster_pid" 2>/dev/null || break; sleep 0.1; done
  grep -q '^ready: ' "$out" || { cat "$out"; echo "cluster_bench.sh: the cluster did not start"; exit 1; }
  router=$(awk '/^router: / { print $2 }' "$out")
  mapfile -t urls < <(awk '/^replica / { print $3 }' "$out")
  echo "== policy $policy: $(grep '^router: ' "$out")"
  "$bin" bench --serving --url "$router" -m "$model" "${bench_flags[@]}" | tee "$out.bench"
  echo
  echo "| policy | replica | requests | prompt tokens computed | prefix-cache hit tokens / looked up | hit rate |"
  echo "|---|---:|---:|---:|---:|---:|"
  tot_req=0 tot_computed=0 tot_hit=0 tot_query=0
  for i in "${!urls[@]}"; do
    u=${urls[$i]}
    req=$(metric "$u" kvserve_requests_finished_total)
    computed=$(metric "$u" kvserve_prompt_tokens_total)
    hit=$(metric "$u" kvserve_prefix_cache_hit_tokens_total)
    query=$(metric "$u" kvserve_prefix_cache_query_tokens_total)
    rate=$(awk -v h="$hit" -v q="$query" 'BEGIN { printf "%.1f%%", (q > 0 ? 100 * h / q : 0) }')
    echo "| $policy | $((i + 1)) | ${req%.*} | ${computed%.*} | ${hit%.*} / ${query%.*} | $rate |"
    tot_req=$((tot_req + ${req%.*})); tot_computed=$((tot_computed + ${computed%.*}))
    tot_hit=$((tot_hit + ${hit%.*})); tot_query=$((tot_query + ${query%.*}))
  done
  rate=$(awk -v h="$tot_hit" -v q="$tot_query" 'BEGIN { printf "%.1f%%", (q > 0 ? 100 * h / q : 0) }')
  echo "| $policy | all | $tot_req | $tot_computed | $tot_hit / $tot_query | $rate |"
  ttft=$(grep -E '^\|' "$out.bench" | tail -1)
  echo "$policy: prompt tokens computed $tot_computed, prefix hits $tot_hit / $tot_query ($rate); bench row: $ttft" >>"$summary"
  kill -TERM "$cluster_pid"; wait "$cluster_pid" 2>/dev/null; cluster_pid=""
  rm -f "$out" "$out.bench"
  echo
done
echo "== summary"
cat "$summary"
rm -f "$summary"
